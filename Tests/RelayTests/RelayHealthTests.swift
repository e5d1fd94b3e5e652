import Logging
import Redis
@testable import Relay
import Testing

/// ``RelayHealth``, the owner of the relay's incidents, alone.
@Suite("Relay health")
struct RelayHealthTests {
    static func health(unreadyAfter seconds: Int = 0) -> RelayHealth {
        RelayHealth(logger: Logger(label: "test"), failOpen: false, unreadyAfterUnreachableSeconds: seconds)
    }

    /// An outage is counted once, however many kinds of call fail in it, and ends when the last
    /// of them succeeds again.
    @Test func anOutageIsCountedOnceAndEndsWithItsLastTrouble() {
        let health = Self.health()
        health.redisFailed(.timedOut, by: .calls)
        health.redisFailed(.timedOut, by: .poll)
        health.redisFailed(.timedOut, by: .calls)
        #expect(health.incidents.value.redisOutages == 1)
        #expect(health.redisCallsFailing)
        health.redisRecovered(by: .calls)
        #expect(!health.redisCallsFailing)
        #expect(health.redisProblem?.hasPrefix("Redis unreachable (not consuming)") == true, "the poll still fails")
        health.redisRecovered(by: .mailboxes)
        #expect(health.incidents.value.redisTrouble != nil, "a kind that did not fail ends nothing")
        health.redisRecovered(by: .poll)
        #expect(health.redisProblem == nil)
        health.redisFailed(.timedOut, by: .mailboxes)
        #expect(health.incidents.value.redisOutages == 2)
    }

    /// The first refusal is kept; publish failures add up; risks are kept as last read.
    @Test func theFirstRefusalIsKept() {
        let health = Self.health()
        health.refuse("maxmemory-policy allkeys-lru")
        health.refuse("something else")
        health.publishFailed()
        health.publishFailed()
        health.redisRisks(["no persistence"])
        #expect(health.incidents.value.refusal == "maxmemory-policy allkeys-lru")
        #expect(health.incidents.value.publishFailures == 2)
        #expect(health.incidents.value.redisRisks == ["no persistence"])
    }

    /// No broker reachable makes the relay unready once it lasted the configured time; one
    /// broker up again ends it at once.
    @Test func noBrokerReachableMakesItUnreadyAfterItsTime() {
        let health = Self.health(unreadyAfter: 0)
        #expect(health.kafkaNotReadyReason == nil)
        health.consumerReaches(false, brokers: ["b1 DOWN"])
        #expect(health.kafkaNotReadyReason?.hasPrefix("no Kafka broker reachable for") == true)
        health.consumerReaches(true, brokers: ["b1 UP"])
        #expect(health.kafkaNotReadyReason == nil)
        let patient = Self.health(unreadyAfter: 3600)
        patient.consumerReaches(false, brokers: ["b1 DOWN"])
        #expect(patient.kafkaNotReadyReason == nil, "not for an hour")
    }
}
