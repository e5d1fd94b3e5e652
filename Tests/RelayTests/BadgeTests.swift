import APNs
import Foundation
import NIOCore
import Redis
@testable import Relay
import RedisTesting
import TestSupport
import Testing

@Suite("Server-side badges", .stopsItsRelays, .timeLimit(.minutes(3)))
struct BadgeTests {
    @Test func theCountGoesIntoApsBadge() {
        func edited(_ json: String, _ count: Int64) -> String {
            String(buffer: BadgeStore.payload(ByteBuffer(string: json), badge: count))
        }
        #expect(edited(#"{"aps":{}}"#, 3) == #"{"aps":{"badge":3}}"#)
        #expect(edited(#"{"aps":{"alert":"hi"},"x":1}"#, 7) == #"{"aps":{"badge":7,"alert":"hi"},"x":1}"#)
        #expect(edited(#"{"x":{"aps":1},"aps":{"alert":"hi","badge":12,"sound":"a"}}"#, 0)
                == #"{"x":{"aps":1},"aps":{"alert":"hi","badge":0,"sound":"a"}}"#)
    }

    @Test(arguments: RedisKind.allCases)
    func countsChangeInOrderOnceEachAndSurviveARestart(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let harness = try await DedupeTests.harness(redis)
        let device = hexToken(0xbad9e)
        let changes = [#"{"increment":1}"#, #"{"increment":1}"#, #"{"increment":1}"#, #"{"set":0}"#, #"{"increment":2}"#]
        for (index, change) in changes.enumerated() {
            try await harness.produce(intent("badge-\(index)", token: device, extra: #","badge":\#(change)"#), key: device)
        }
        let outcomes = try await harness.outcomes(count: 5)
        let badges = Dictionary(uniqueKeysWithValues: outcomes.map { ($0["id"] as? String ?? "", $0["badge"] as? Int ?? -1) })
        #expect(badges == ["badge-0": 1, "badge-1": 2, "badge-2": 3, "badge-3": 0, "badge-4": 2])
        let sent = harness.simulator.accepted.filter { $0.deviceToken == device }.map { payload in
            ((try? JSONSerialization.jsonObject(with: Data(payload.payload))) as? [String: Any])?["aps"] as? [String: Any]
        }.compactMap { $0?["badge"] as? Int }
        #expect(sent == [1, 2, 3, 0, 2])
        try await harness.stopExpectingOneOutcomeEach()

        // Another relay later (a restart): the count is where it was. (This harness signs with a
        // new key under the same key id, so the fleet's stored token must go.)
        let cleanup = try redis.client()
        _ = try await cleanup.send(RedisCommand("DEL", ["apns-relay:jwt:{TEAM123456:ABC123DEFG}"]))
        await cleanup.shutdown()
        let again = try await DedupeTests.harness(redis)
        try await again.produce(intent("badge-later", token: device, extra: #","badge":{"increment":1}"#), key: device)
        let later = try await again.outcomes(count: 1)
        #expect(later.first?["badge"] as? Int == 3)
        #expect(later.first?["status"] as? String == "delivered")
        await again.stop()

        // `inspect` shows the device's last notification (with the badge sent) and its count.
        let run = try await RelayBinary.run(["inspect", "--redis", redis.url, "--redis-mode", kind.rawValue,
                                             "--token", device, "--topic", "com.example.app"])
        let text = run.stdout
        #expect(run.status == 0, "\(text)")
        #expect(text.contains(#"last sent: {"id":"badge-later","apns_id":""#), "\(text)")
        #expect(text.contains(#""aps":{"badge":3"#), "\(text)")
        #expect(text.contains("badge: 3"), "\(text)")
    }

    @Test func anIntentAppliedTwiceChangesTheCountOnce() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let store = BadgeStore(client: client, keys: .standard, appliedTTL: 60)
        let token = hexToken(42)
        #expect(try await store.apply(.increment(1), intentID: "a", token: token, topic: "com.x") == 1)
        // A retry or a redelivery of "a" gets the count it produced, unchanged.
        #expect(try await store.apply(.increment(1), intentID: "a", token: token, topic: "com.x") == 1)
        #expect(try await store.apply(.increment(-5), intentID: "b", token: token, topic: "com.x") == 0)
        #expect(try await store.apply(.set(9), intentID: "c", token: token, topic: "com.y") == 9)
        #expect(try await store.apply(.increment(1), intentID: "d", token: token, topic: "com.x") == 1)
        // The count stays within the limit, and a count key someone overwrote counts as 0.
        #expect(try await store.apply(.set(BadgeChange.limit), intentID: "e", token: token, topic: "com.x") == BadgeChange.limit)
        #expect(try await store.apply(.increment(5), intentID: "f", token: token, topic: "com.x") == BadgeChange.limit)
        _ = try await client.send(RedisCommand("SET", [RedisKeys.standard.badgeCount(token: token, topic: "com.x"), "garbage"]))
        #expect(try await store.apply(.increment(2), intentID: "g", token: token, topic: "com.x") == 2)
        await client.shutdown()
    }

    @Test func withoutRedisABadgeIntentFails() async throws {
        let harness = try await RelayHarness.start()
        try await harness.produce(intent("nb", token: hexToken(5), extra: #","badge":{"increment":1}"#), key: hexToken(5))
        let outcome = try #require(try await harness.outcomes(count: 1).first)
        #expect(outcome["status"] as? String == "failed")
        #expect(outcome["reason"] as? String == "BadgeNeedsRedis")
        #expect(harness.simulator.accepted.isEmpty)
        try await harness.stopExpectingOneOutcomeEach()
    }
}
