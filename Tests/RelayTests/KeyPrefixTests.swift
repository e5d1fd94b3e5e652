import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `redis.key_prefix`: two deployments (staging and production, two tenants) on one Redis.
@Suite("Redis key prefix", .stopsItsRelays, .timeLimit(.minutes(3)))
struct KeyPrefixTests {
    /// Two relays with their own prefixes, their own Kafka and APNs, one redis-server (or one
    /// Redis Cluster), the same device, app and intent ids: neither sees the other's dedupe
    /// records, bucket or mailbox, and every key either writes (the due indexes and the
    /// provider token included) is under its prefix. With one prefix, the second relay's
    /// `same-1` came out `duplicate` and its `same-2` met the first relay's parked `same-2` as
    /// its own.
    @Test(arguments: RedisKind.allCases)
    func twoRelaysWithTheirOwnPrefixesShareARedisWithoutMeeting(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let token = hexToken(0x9F1)
        let prefixes = ["staging/apns-relay:", "production/apns-relay:"]
        let client = try redis.client()
        var relays: [RelayHarness] = []
        for prefix in prefixes {
            // Burst 1, a token per 10 s: the device's second intent parks, in a mailbox under
            // the relay's own prefix, until about 10 s after the first went out. Each relay gets
            // both of its intents at once and its mailbox is read before the next relay starts:
            // a relay that waited on the other one's first delivery could see its token refill
            // before its second intent came, and send it at once.
            let relay = try await PolicyTests.harness(redis, burst: 1, refill: 0.1, configure: { $0.redis.keyPrefix = prefix })
            relays.append(relay)
            try await relay.produce(intent("same-1", token: token), key: token)
            try await relay.produce(intent("same-2", token: token), key: token)
            try await relay.published.waitUntil { $0.count("delivered") == 1 }
            let mailbox = RedisKeys(prefix: prefix).mailbox(token: token, topic: "com.example.app")
            try await waitUntil(timeout: slowed(.seconds(30)), asking: {
                (try? await client.send(RedisCommand("HGET", [mailbox, "pid"])))?.string == "same-2"
            })
        }
        for relay in relays {
            try await relay.published.waitUntil(timeout: slowed(.seconds(40))) { $0.count("delivered") == 2 }
            #expect(relay.simulator.accepted.count == 2, "each relay sent both of its intents once")
        }
        let keys = try await client.onEveryNode([RedisCommand("KEYS", ["*"])]).flatMap { $0.replies[0].array ?? [] }.compactMap(\.string)
        #expect(!keys.isEmpty && keys.allSatisfy { key in prefixes.contains { key.hasPrefix($0) } }, "\(keys)")
        for prefix in prefixes {
            #expect(keys.contains(RedisKeys(prefix: prefix).seen(token: token, topic: "com.example.app", id: "same-2")))
        }
        await client.shutdown()
        for relay in relays { try await relay.stopExpectingOneOutcomeEach() }
    }
}
