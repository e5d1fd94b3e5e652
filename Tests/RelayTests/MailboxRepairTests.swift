import APNs
import Foundation
import Redis
@testable import Relay
import RedisTesting
import TestSupport
import Testing

/// Mailboxes left in the states a crash, a rebalance or a race leaves them in (written straight
/// into a real redis-server), and what the relay makes of them.
@Suite("Mailboxes left half-written", .timeLimit(.minutes(3)))
struct MailboxRepairTests {
    static func nowMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    static func entry(_ json: String, expiration: Int64) -> [UInt8] {
        DevicePolicy.Entry(partition: 0, offset: 0, consumedAt: nowMilliseconds(), expiration: expiration,
                           message: Array(json.utf8)).encoded
    }

    /// Review 1.1: the relay died between the park script and the due-index `ZADD`. Its intent's
    /// offset was not committed, so the intent comes again; it must be delivered, not taken for
    /// "already in the mailbox" and left there unindexed.
    @Test func aParkWhoseIndexWriteNeverHappenedIsDeliveredWhenItsIntentComesAgain() async throws {
        let redis = try RedisServerProcess()
        let token = hexToken(0x1a)
        let json = intent("stranded-1", token: token)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.mailbox(token: token, topic: "com.example.app"),
                                  "pid", "stranded-1", "p", Self.entry(json, expiration: expiration), "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.waiting(token: token, topic: "com.example.app"), "10:stranded-1"]),
        ])
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        try await harness.produce(json, key: token)
        let outcomes = try await harness.outcomes(count: 1)
        #expect(outcomes.map { $0["id"] as? String } == ["stranded-1"])
        #expect(outcomes.first?["status"] as? String == "delivered")
        #expect(PolicyTests.sent(harness, "stranded-1") == 1)
        await harness.stop()
        await client.shutdown()
    }

    /// Review 1.2: a take that finds another relay's claim with its lease still running must
    /// not drop the claim's due-index member (the claim would never be retried if that relay
    /// then lost the partition); the member moves to the lease's end.
    @Test func aLiveClaimKeepsItsIndexMemberUntilItsLeaseEnds() async throws {
        let redis = try RedisServerProcess()
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        // Once one intent is answered the relay owns the partitions and polls their mailboxes.
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)

        let token = hexToken(0x1b)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let leaseEnd = Self.nowMilliseconds() + 100_000
        let member = RedisKeys.member(token: token, topic: "com.example.app", id: "claimed-1")
        let due = RedisKeys.due(intentsTopic: harness.intentsTopic, partition: 0)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.mailbox(token: token, topic: "com.example.app"),
                                  "cid", "claimed-1", "c", Self.entry(intent("claimed-1", token: token), expiration: expiration),
                                  "ce", expiration, "cu", leaseEnd]),
            RedisCommand("SET", [RedisKeys.waiting(token: token, topic: "com.example.app"), "0:claimed-1"]),
            RedisCommand("ZADD", [due, 0, member]),
        ])
        // The poller takes it (due 0) within 100 ms, finds the live claim, and moves it.
        try await waitUntil(asking: {
            let score = try? await client.send(RedisCommand("ZSCORE", [due, member]))
            return score?.string.flatMap { Int64($0) } == leaseEnd
        })
        #expect(PolicyTests.sent(harness, "claimed-1") == 0)
        await harness.stop()
        await client.shutdown()
    }
}
