import Foundation
@testable import Relay
import RedisTesting
import Testing

/// Review 1.3: parked intents live only in Redis once their offsets are committed, so the relay
/// refuses a Redis that may evict them.
@Suite("Redis guarantees for parked intents", .stopsItsRelays, .timeLimit(.minutes(3)))
struct RedisGuaranteesTests {
    @Test func infoIsReadForThePolicyAndAppendOnly() {
        let info = "# Memory\r\nused_memory:1\r\nmaxmemory_policy:volatile-lru\r\n\r\n# Persistence\r\naof_enabled:1\r\n"
        #expect(RedisGuarantees.parse(info: info) == RedisGuarantees(evictionPolicy: "volatile-lru", appendOnly: true))
        #expect(RedisGuarantees.parse(info: "maxmemory_policy:noeviction\naof_enabled:0") == RedisGuarantees(evictionPolicy: "noeviction", appendOnly: false))
        #expect(RedisGuarantees.parse(info: "aof_enabled:0") == nil)
        #expect(RedisGuarantees(evictionPolicy: "noeviction", appendOnly: true).evictionRisk == nil)
        #expect(RedisGuarantees(evictionPolicy: "noeviction", appendOnly: true).persistenceRisk == nil)
        // Every relay key has a TTL: volatile policies evict them as surely as allkeys ones.
        #expect(RedisGuarantees(evictionPolicy: "volatile-ttl", appendOnly: true).evictionRisk?.contains("volatile-ttl") == true)
        #expect(RedisGuarantees(evictionPolicy: "noeviction", appendOnly: false).persistenceRisk != nil)
    }

    @Test func aRedisThatCanEvictIsRefusedBeforeAnythingIsConsumed() async throws {
        let redis = try await RedisServerProcess.started(arguments: ["--maxmemory-policy", "allkeys-lru"])
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        try await harness.produce(intent("never-1", token: hexToken(1)), key: hexToken(1))
        // The relay stops on its own.
        await harness.running.value
        let refusal = try #require(harness.pipeline.refusal)
        #expect(refusal.contains("allkeys-lru"))
        #expect(refusal.contains("redis.allow_eviction"))
        #expect(harness.pipeline.notAliveReason == refusal)
        #expect(harness.pipeline.outcomeCounts.isEmpty)
        #expect(harness.simulator.accepted.isEmpty)
        await harness.stop()
    }

    @Test func anOperatorMayAcceptEviction() async throws {
        let redis = try await RedisServerProcess.started(arguments: ["--maxmemory-policy", "volatile-lru"])
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10, configure: { $0.redis.allowEviction = true })
        try await harness.produce(intent("allowed-1", token: hexToken(1)), key: hexToken(1))
        let outcomes = try await harness.outcomes(count: 1)
        #expect(outcomes.first?["status"] as? String == "delivered")
        #expect(harness.pipeline.refusal == nil)
        try await harness.stopExpectingOneOutcomeEach()
    }
}
