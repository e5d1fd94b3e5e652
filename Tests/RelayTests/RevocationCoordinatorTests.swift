import Foundation
import Kafka
import Logging
@testable import Relay
import TestSupport
import Testing

/// ``RevocationCoordinator``: what a revocation waits for, and the commits it counts.
@Suite("Revocation coordinator")
struct RevocationCoordinatorTests {
    /// The metric sees each failed revocation commit once.
    @Test func eachFailedCommitIsCountedOnce() {
        let coordinator = RevocationCoordinator(shutdownDeadlineSeconds: 1, consumerSettings: [:], backoffMaximum: .seconds(1),
                                                logger: Logger(label: "test"))
        #expect(coordinator.commitFailuresNotCounted(3) == 3)
        #expect(coordinator.commitFailuresNotCounted(5) == 2)
        #expect(coordinator.commitFailuresNotCounted(5) == 0)
    }

    /// A revocation waits for the work at APNs of the partitions it revokes, not for that of an
    /// earlier revocation that gave up at its bound and whose partitions are still marked
    /// revoking (the reader has not had it yet): a revocation of a partition with nothing at
    /// APNs waits for nothing. (Waiting for every marked partition of a shard, the second
    /// revocation waited out its bound too, and gave up.)
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)))
    func aRevocationWaitsOnlyForItsOwnPartitionsWork() async throws {
        let harness = try await RelayHarness.start(configureRelay: { $0.shutdownDeadlineSeconds = 1 }, shards: 2)
        let pipeline = harness.pipeline
        try await waitUntil(timeout: .seconds(30)) { pipeline.owned.count == 4 }
        // Partitions of a topic of the test's own, beside the relay's four.
        let topic = "revoking-\(UUID().uuidString.prefix(4))"
        let (ten, eleven) = (TopicPartition(topic: topic, partition: 10), TopicPartition(topic: topic, partition: 11))
        await pipeline.assign([ten, eleven])
        // Work of ten at APNs that does not end.
        let box = pipeline.shard(of: ten)
        let generation = try #require(await box.onLoop { $0.partitions.generation(of: ten) })
        #expect(await box.onLoop { $0.partitions.sendBegins(ten, generation: generation, first: true) })
        // Its revocation waits for it, and gives up at its bound (the shutdown deadline, 1 s).
        pipeline.partitionsRevoking([ten], lost: false)
        #expect(await box.onLoop { $0.revocationAwaits } == [ten])
        // Before the reader has that revocation, another comes, for eleven.
        pipeline.partitionsRevoking([eleven], lost: false)
        for shard in pipeline.shards { #expect(await shard.onLoop { $0.revocationAwaits.isEmpty }, "shard \(shard.index)") }
        await pipeline.revoke([ten, eleven])
        await harness.stop()
    }
}
