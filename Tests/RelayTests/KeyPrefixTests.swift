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
        var relays: [RelayHarness] = []
        for prefix in prefixes {
            // Burst 1, a token per 5 s: a device's second intent parks.
            relays.append(try await PolicyTests.harness(redis, burst: 1, refill: 0.2, configure: { $0.redis.keyPrefix = prefix }))
        }
        for relay in relays {
            try await relay.produce(intent("same-1", token: token), key: token)
            try await relay.published.waitUntil { $0.count("delivered") == 1 }
        }
        for relay in relays {
            try await relay.produce(intent("same-2", token: token), key: token)
        }
        let client = try redis.client()
        // Each relay parked its own `same-2` in a mailbox under its own prefix (within 30 s,
        // stretched under a sanitizer: a full thread-sanitizer run, its Redis Cluster suites
        // beside it, once took longer).
        for prefix in prefixes {
            let mailbox = RedisKeys(prefix: prefix).mailbox(token: token, topic: "com.example.app")
            try await waitUntil(timeout: slowed(.seconds(30)), asking: {
                (try? await client.send(RedisCommand("HGET", [mailbox, "pid"])))?.string == "same-2"
            })
        }
        for relay in relays {
            try await relay.published.waitUntil { $0.count("delivered") == 2 }
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
