import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `policy.skip_known_unregistered`: a 410 remembered per (token, topic) answers later intents
/// without asking APNs, unless they say the token was registered since.
@Suite("Known unregistered tokens", .stopsItsRelays, .timeLimit(.minutes(3)))
struct KnownUnregisteredTests {
    static let gone = hexToken(0x410)
    static let unregisteredAt: Int64 = 1_732_400_000_000

    static func harness(_ redis: RedisServerProcess, skip: Bool) async throws -> RelayHarness {
        try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: {
            $0.policy.skipKnownUnregistered = skip
            $0.policy.knownUnregisteredTTLSeconds = 3600
            $0.kafka.invalidationsTopic = "apns.invalidations.\(UUID().uuidString.prefix(8))"
        }, simulator: { $0.behaviour.unregistered = [gone: unregisteredAt] })
    }

    static func toGone(_ id: String, registeredAt: Int64? = nil) -> String {
        intent(id, token: gone, extra: registeredAt.map { #","token_registered_at":\#($0)"# } ?? "")
    }

    /// Produces one intent and waits for its outcome (each after the one before: an admission
    /// reads what the answers before it wrote).
    static func answer(_ harness: RelayHarness, _ json: String, id: String, outcomesSoFar: Int) async throws -> [String: Any] {
        try await harness.produce(json, key: gone)
        return try #require(PolicyTests.byID(try await harness.outcomes(count: outcomesSoFar + 1))[id])
    }

    /// The `DEL`s the server ran so far (`INFO commandstats`: every client's, so a test that
    /// compares two counts has nothing else deleting meanwhile: no parks, no badges).
    static func deleteCalls(_ client: RedisClient) async throws -> Int {
        let info = try await client.send(RedisCommand("INFO", ["commandstats"])).string ?? ""
        guard let line = info.split(whereSeparator: \.isNewline).first(where: { $0.hasPrefix("cmdstat_del:calls=") }) else { return 0 }
        return Int(line.dropFirst("cmdstat_del:calls=".count).prefix { $0.isNumber }) ?? 0
    }

    @Test func aRememberedFourTenAnswersUntilTheTokenIsRegisteredAgain() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, skip: true)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let key = RedisKeys.standard.unregistered(token: Self.gone, topic: "com.example.app")
        // APNs answers the first: the 410 is remembered with APNs' timestamp, for the TTL.
        let first = try await Self.answer(harness, Self.toGone("gone-1"), id: "gone-1", outcomesSoFar: 0)
        #expect(first["status"] as? String == "unregistered" && first["http_status"] as? Int == 410)
        #expect(try await client.send(RedisCommand("GET", [key])).integer == Self.unregisteredAt)
        let ttl = try await client.send(RedisCommand("TTL", [key])).integer ?? 0
        #expect(ttl > 3500 && ttl <= 3600)
        let inspected = try await RelayBinary.run(["inspect", "--redis", redis.url, "--token", Self.gone, "--topic", "com.example.app"])
        #expect(inspected.status == 0 && inspected.stdout.contains("410 remembered"), "\(inspected.stdout)")
        // Without token_registered_at, or with an older one: answered here, nothing sent.
        for (index, registeredAt) in [nil, Self.unregisteredAt - 1, Self.unregisteredAt].enumerated() {
            let id = "gone-\(index + 2)"
            let known = try await Self.answer(harness, Self.toGone(id, registeredAt: registeredAt), id: id, outcomesSoFar: index + 1)
            #expect(known["status"] as? String == "unregistered", "\(id)")
            #expect(known["reason"] as? String == "KnownUnregistered")
            #expect(known["unregistered_at"] as? Int == Int(Self.unregisteredAt))
            #expect(known["http_status"] is NSNull && known["attempts"] as? Int == 0)
        }
        #expect(harness.simulator.answers == ["410 Unregistered": 1], "APNs was asked once")
        // Registered again after the 410: sent, delivered, and the 410 is forgotten.
        harness.simulator.update { $0.unregistered = [:] }
        let back = try await Self.answer(harness, Self.toGone("back-1", registeredAt: Self.unregisteredAt + 1), id: "back-1", outcomesSoFar: 4)
        #expect(back["status"] as? String == "delivered")
        #expect(try await client.send(RedisCommand("EXISTS", [key])).integer == 0)
        // With the option on, a delivery deletes whatever its read found: this relay may have
        // remembered a 410 since, for an earlier intent of the pair.
        let deletes = try await Self.deleteCalls(client)
        let after = try await Self.answer(harness, Self.toGone("back-2"), id: "back-2", outcomesSoFar: 5)
        #expect(after["status"] as? String == "delivered")
        #expect(try await Self.deleteCalls(client) == deletes + 1)
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
        // The invalidations topic got the 410 once (the answers from the remembered 410 publish
        // nothing), then a tombstone per delivery.
        let records = try await InvalidationTests.records(harness)
        #expect(records.map(\.hasNullValue) == [false, true, true])
        #expect(try records.first.map { try InvalidationTests.object($0)["intent_id"] as? String } == "gone-1")
    }

    @Test func offEveryIntentIsAskedNothingIsRememberedAndADeliveryForgets() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, skip: false)
        _ = try await Self.answer(harness, Self.toGone("gone-1"), id: "gone-1", outcomesSoFar: 0)
        let second = try await Self.answer(harness, Self.toGone("gone-2"), id: "gone-2", outcomesSoFar: 1)
        #expect(second["status"] as? String == "unregistered" && second["reason"] as? String == "Unregistered")
        #expect(harness.simulator.answers == ["410 Unregistered": 2])
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let key = RedisKeys.standard.unregistered(token: Self.gone, topic: "com.example.app")
        #expect(try await client.send(RedisCommand("EXISTS", [key])).integer == 0)
        // A 410 remembered while the option was on is forgotten by a delivery while it is off.
        _ = try await client.send(RedisCommand("SET", [key, "\(Self.unregisteredAt)"]))
        harness.simulator.update { $0.unregistered = [:] }
        let deletesBefore = try await Self.deleteCalls(client)
        let back = try await Self.answer(harness, Self.toGone("back-1"), id: "back-1", outcomesSoFar: 2)
        #expect(back["status"] as? String == "delivered")
        #expect(try await client.send(RedisCommand("EXISTS", [key])).integer == 0)
        let deletes = try await Self.deleteCalls(client)
        #expect(deletes == deletesBefore + 1)
        // A delivery whose admission read found no 410 has none to delete: no DEL sent.
        let again = try await Self.answer(harness, Self.toGone("back-2"), id: "back-2", outcomesSoFar: 3)
        #expect(again["status"] as? String == "delivered")
        #expect(try await Self.deleteCalls(client) == deletes)
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// The decision alone: a duplicate stays a duplicate; a remembered 410 that applies to the
    /// newest of a collapse id lets an older one registered since go out in its place.
    @Test func theDecisionTakesTheRegistrationTimeIntoAccount() throws {
        func parsed(_ id: String, _ registeredAt: Int64?, collapse: String? = nil) throws -> Intent {
            var fields = [#""id":"\#(id)""#, #""token":"\#(Self.gone)""#, #""topic":"com.x""#, #""payload":{"aps":{}}"#]
            if let registeredAt { fields.append(#""token_registered_at":\#(registeredAt)"#) }
            if let collapse { fields.append(#""collapse_id":"\#(collapse)""#) }
            return try IntentTests.parse("{" + fields.joined(separator: ",") + "}").get()
        }
        let intents = [try parsed("old", 20, collapse: "c"), try parsed("new", 5, collapse: "c"), try parsed("plain", nil),
                       try parsed("seen", nil)]
        var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
        BatchAdmission.group(intents.map { .success($0) }, rules: BatchAdmissionTests.rules(), skipsKnownUnregistered: true,
                             groups: &groups, members: &members)
        let group = try #require(groups.first)
        #expect(group.readsUnregistered && group.skipsKnownUnregistered && group.registeredAt == [20, 5, nil, nil])
        var bucket = DeviceAdmission.Bucket(.init(burst: 10, refillPerSecond: 1), stored: nil, now: 0)
        let decisions = DeviceAdmission.decide(group, waiting: nil, backoffUntil: 0, bucket: &bucket, now: 0, unregisteredAt: 10) {
            group.ids[$0] == "seen" ? .some(AnswerRecord(status: "unregistered", httpStatus: 410)) : nil
        }
        #expect(decisions == [.send, .knownUnregistered(at: 10), .knownUnregistered(at: 10),
                              .duplicate(AnswerRecord(status: "unregistered", httpStatus: 410))])
        // token_registered_at goes with a parked intent into its mailbox and back.
        let encoded = try Intent.parse(intents[0].encoded, key: nil, now: 0, defaultTTL: 60)
        #expect(encoded.tokenRegisteredAt == 20)
    }
}
