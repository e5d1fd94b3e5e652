import APNsSimulator
import Foundation
import KafkaTesting
import NIOCore
import Relay
import TestSupport
import Testing

/// Two minutes each, stretched under a sanitizer: alone under the thread sanitizer the outage
/// test takes about 12 s, but once, in the whole sanitized suite, it took 204 s, every wait in it
/// met.
@Suite("A Kafka outage while intents are in flight", .stopsItsRelays, .timeLimit(.minutes(2 * sanitizerSlowdown)))
struct KafkaOutageTests {
    /// Outcomes that cannot be published while the brokers refuse every produce: the intents
    /// stay in flight and uncommitted, none is sent to APNs again, and once Kafka takes
    /// outcomes again each gets its one outcome and everything is committed.
    @Test func kafkaOutageLosesNothing() async throws {
        // APNs takes 3 s: all 100 of the second round are in flight at once even when consuming
        // and sending them takes a loaded machine a second or two. A minute per request: with
        // the default 10 s a starved sanitizer run can time out requests the simulator took, and
        // send them again (the second send docs/outcomes.md allows after a lost answer, not the
        // one this test is about).
        let harness = try await RelayHarness.start(configure: { $0.behaviour.latency = .milliseconds(3000) }, configureRelay: {
            $0.kafka.properties["message.timeout.ms"] = "1000"
            $0.apns.requestTimeoutSeconds = 60
        })
        for index in 0..<100 { try await harness.produce(intent("before-\(index)", token: hexToken(index)), key: hexToken(index)) }
        _ = try await harness.outcomes(count: 100)
        try await waitUntil(timeout: .seconds(20), asking: { ((try? await harness.committedTotal()) ?? 0) == 100 })

        // 100 more, all with APNs (3 s each) when the outage starts.
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<100).map {
            (Array(hexToken(500 + $0).utf8), Array(intent("during-\($0)", token: hexToken(500 + $0)).utf8))
        })
        try await waitUntil { harness.pipeline.inFlight == 100 }
        harness.cluster.failRequests(apiKey: KafkaMockCluster.APIKey.produce, errorCode: KafkaErrorCode.notLeaderForPartition)
        // The outage: APNs answers, the outcomes' deliveries fail (and are tried again).
        try await harness.pipeline.incidents.waitUntil(timeout: .seconds(30)) { $0.publishFailures > 0 }
        #expect(harness.pipeline.outcomeCounts.values.reduce(0, +) == 100)
        #expect(harness.pipeline.inFlight == 100)
        #expect(try await harness.committedTotal() == 100)
        #expect(harness.simulator.accepted.count == 200)

        harness.cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.produce)
        let outcomes = try await harness.outcomes(count: 200)
        #expect(Set(outcomes.compactMap { $0["id"] as? String }).count == 200)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        // Nothing went to APNs twice: the answers waited for Kafka, they were not asked again
        // (one attempt each: a second would be a resend, after a refusal or a lost answer).
        #expect(harness.simulator.accepted.count == 200)
        #expect(outcomes.allSatisfy { $0["attempts"] as? Int == 1 }, "\(outcomes.filter { $0["attempts"] as? Int != 1 }.prefix(3))")
        #expect(try await harness.stopExpectingOneOutcomeEach().count == 200)
        #expect(try await harness.committedTotal() == 200)
    }

    /// A stop while Kafka takes no outcome ends within `shutdown_deadline_seconds` and a
    /// stated bound (the producer's records still waiting are purged, failing their deliveries),
    /// not when librdkafka's `message.timeout.ms` (20 s here) gives up on them. The intents
    /// stay uncommitted: redelivered to the next owner.
    @Test func aStopWhileKafkaTakesNoOutcomeEndsByTheDeadline() async throws {
        // APNs takes 3 s per request: long enough that all 20 are at APNs at once (below) also
        // when a loaded machine spreads their consumption over more than a second.
        let harness = try await RelayHarness.start(configure: { $0.behaviour.latency = .milliseconds(3000) }, configureRelay: {
            $0.shutdownDeadlineSeconds = 2
            $0.kafka.properties["message.timeout.ms"] = "20000"
            // A minute per request, as above: no request taken by the simulator is sent again.
            $0.apns.requestTimeoutSeconds = 60
        })
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<20).map {
            (Array(hexToken(100 + $0).utf8), Array(intent("stuck-\($0)", token: hexToken(100 + $0)).utf8))
        })
        // All at APNs (3 s each), then Kafka refuses every produce: their outcomes wait.
        try await waitUntil(timeout: .seconds(20)) { harness.pipeline.inFlight == 20 }
        harness.cluster.failRequests(apiKey: KafkaMockCluster.APIKey.produce, errorCode: KafkaErrorCode.notLeaderForPartition)
        try await waitUntil(timeout: .seconds(20)) { harness.simulator.accepted.count == 21 }
        let stopped = ContinuousClock.now
        harness.pipeline.requestStop()
        await harness.running.value
        let took = ContinuousClock.now - stopped
        // The deadline (2 s), the purge's delivery reports, the final flush and commit.
        #expect(took < slowed(.seconds(8)), "the stop took \(took)")
        harness.cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.produce)
        #expect(try await harness.committedTotal() == 1)
        await harness.stop()
    }

    /// A relay whose consumer reaches no broker for `kafka.unready_after_unreachable_seconds`
    /// says it is not ready (librdkafka's statistics say so), and ready again once a broker
    /// answers; it keeps running meanwhile.
    @Test func noBrokerReachableMakesTheRelayUnreadyUntilOneIs() async throws {
        let harness = try await RelayHarness.start(configureRelay: {
            $0.kafka.properties["statistics.interval.ms"] = "100"
            $0.kafka.unreadyAfterUnreachableSeconds = 1
        })
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)
        #expect(harness.pipeline.notReadyReason == nil)
        await harness.cluster.setBroker(1, up: false)
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.notReadyReason?.hasPrefix("no Kafka broker reachable for") == true }
        #expect(harness.pipeline.notAliveReason == nil)
        await harness.cluster.setBroker(1, up: true)
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.notReadyReason == nil }
        try await harness.produce(intent("after", token: hexToken(2)), key: hexToken(2))
        _ = try await harness.outcomes(count: 2)
        await harness.stop()
    }

    /// A relay made and dropped, as a reload drops the one it replaces, is freed with its
    /// pipeline: nothing its Kafka clients keep (their statistics handlers) holds it.
    @Test func aDroppedRelayIsFreed() async throws {
        let harness = try await RelayHarness.start()
        weak var pipeline: RelayPipeline?
        do {
            let dropped = try RelayApplication(configuration: harness.configuration, worker: "dropped")
            pipeline = dropped.pipeline
            #expect(pipeline != nil)
        }
        #expect(pipeline == nil, "the dropped relay's pipeline is still held")
        await harness.stop()
    }
}
