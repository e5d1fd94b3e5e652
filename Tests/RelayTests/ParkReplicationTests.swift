import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `redis.park_min_replicas` against a redis-server primary and a real replica of it.
@Suite("Parks acknowledged by replicas", .stopsItsRelays, .timeLimit(.minutes(3)))
struct ParkReplicationTests {
    /// A primary and one replica of it, in sync.
    static func primaryWithReplica() async throws -> (primary: RedisServerProcess, replica: RedisServerProcess) {
        let servers = try await onOwnThread {
            Result {
                let primary = try RedisServerProcess()
                return (primary, try RedisServerProcess(arguments: ["--replicaof", "127.0.0.1", "\(primary.port)"]))
            }
        }.get()
        try await Self.waitUntilInSync(servers.1)
        return servers
    }

    static func waitUntilInSync(_ replica: RedisServerProcess) async throws {
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: replica.url)))
        try await waitUntil(asking: {
            (try? await client.send(RedisCommand("INFO", ["replication"])))?.string?.contains("master_link_status:up") == true
        })
        await client.shutdown()
    }

    @Test func aParkCountsOnceItsReplicaHasItAndWaitsWhileNoneAnswers() async throws {
        let (primary, replica) = try await Self.primaryWithReplica()
        // One token per 5 s: the second intent at a device parks even when the relay takes its
        // time between the two (with one per second, a loaded machine let it go out directly).
        let harness = try await PolicyTests.harness(primary, burst: 1, refill: 0.2, configure: { $0.redis.parkMinReplicas = 1 })
        // A second intent at a device with one token parks, its replica acknowledges, it goes out.
        let first = hexToken(0x5a)
        try await harness.produce(intent("sent-1", token: first), key: first)
        try await harness.produce(intent("parked-1", token: first), key: first)
        let before = PolicyTests.byID(try await harness.outcomes(count: 2))
        #expect(before["sent-1"]?["status"] as? String == "delivered")
        #expect(before["parked-1"]?["status"] as? String == "delivered")

        // Without the replica no park counts: the relay says Redis is failing, the intent waits.
        let outagesBefore = harness.pipeline.redisOutages
        await onOwnThread { replica.stop() }
        let second = hexToken(0x5b)
        try await harness.produce(intent("sent-2", token: second), key: second)
        try await harness.produce(intent("parked-2", token: second), key: second)
        // Counted as an outage (the status itself turns back with every read Redis answers, so
        // the count is what is waited for).
        try await harness.pipeline.incidents.waitUntil { $0.redisOutages > outagesBefore }
        try await harness.published.waitUntil { $0.count("delivered") == 3 }
        #expect(PolicyTests.sent(harness, "parked-2") == 0)

        // A replica back and in sync: the park is asked again, counts, and the intent goes out.
        // (A new one on a port of its own: the old port may be taken meanwhile, and the relay
        // talks only to the primary.)
        let back = try await onOwnThread {
            Result { try RedisServerProcess(arguments: ["--replicaof", "127.0.0.1", "\(primary.port)"]) }
        }.get()
        try await Self.waitUntilInSync(back)
        let after = PolicyTests.byID(try await harness.outcomes(count: 4))
        #expect(after["parked-2"]?["status"] as? String == "delivered")
        #expect(PolicyTests.sent(harness, "parked-2") == 1)
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble == nil }
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A redelivered intent its mailbox already holds (the relay died after the park, its
    /// replicas' acknowledgement not in) counts as parked only once the replicas have the
    /// mailbox and its index entry, as a park does: without a replica it is an outage, and its
    /// offset is not committed.
    @Test func aRedeliveredParkedIntentWaitsForItsReplicasToo() async throws {
        let (primary, replica) = try await Self.primaryWithReplica()
        let harness = try await PolicyTests.harness(primary, burst: 10, refill: 10, configure: { $0.redis.parkMinReplicas = 1 })
        try await harness.produce(intent("warm-up", token: hexToken(0x5c)), key: hexToken(0x5c))
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        try await waitUntil(timeout: .seconds(20), asking: { ((try? await harness.committedTotal()) ?? 0) == 1 })
        let committed = 1
        await onOwnThread { replica.stop() }
        // The park was written (the replica may not have it) and the relay died: the intent comes again.
        let token = hexToken(0x5d), expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: primary.url)))
        let entry = MailboxRepairTests.entry(intent("stranded", token: token), expiration: expiration)
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"), "pid", "stranded", "p", entry,
                                  "pe", expiration, "pd", Int64(Date().timeIntervalSince1970 * 1000) + 600_000]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "8:stranded"]),
        ])
        let outagesBefore = harness.pipeline.redisOutages
        try await harness.produce(intent("stranded", token: token), key: token)
        try await harness.pipeline.incidents.waitUntil(timeout: .seconds(30)) { $0.redisOutages > outagesBefore }
        #expect(try await harness.committedTotal() == committed, "committed without the replicas' acknowledgement")
        await client.shutdown()
        await harness.stop()
    }
}
