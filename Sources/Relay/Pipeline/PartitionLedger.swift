import Kafka

/// The partitions this relay owns and where each one's work stands: per partition an
/// ``OffsetTracker`` and a generation, bumped at every assignment and revocation, so that work
/// started under an earlier ownership is known as no longer ours even once the partition came
/// back. A value type: the pipeline keeps it under its state lock and stores the committable
/// offsets it returns.
struct PartitionLedger: Sendable {
    private var trackers: [TopicPartition: OffsetTracker] = [:]
    private var generations: [TopicPartition: Int] = [:]

    /// The partitions are ours from now on (a new generation each).
    mutating func assign(_ partitions: [TopicPartition]) {
        for partition in partitions {
            trackers[partition] = OffsetTracker()
            generations[partition, default: 0] += 1
        }
    }

    /// The partitions are no longer ours: their work in flight is abandoned (its offsets are
    /// never stored).
    mutating func revoke(_ partitions: [TopicPartition]) {
        for partition in partitions {
            trackers[partition] = nil
            generations[partition, default: 0] += 1
        }
    }

    /// An offset of an owned partition starts: its generation, or nil when the partition is not
    /// ours (the message is dropped).
    mutating func start(_ partition: TopicPartition, offset: Int64) -> Int? {
        guard trackers[partition] != nil, let generation = generations[partition] else { return nil }
        trackers[partition]?.started(offset)
        return generation
    }

    /// Whether work started under `generation` is still ours.
    func owns(_ partition: TopicPartition, generation: Int) -> Bool {
        trackers[partition] != nil && generations[partition] == generation
    }

    /// An offset's work ended: the partition's new committable offset when it moved (nil when
    /// it did not, or the work is no longer ours).
    mutating func finish(_ partition: TopicPartition, generation: Int, offset: Int64) -> Int64? {
        guard owns(partition, generation: generation) else { return nil }
        return trackers[partition]?.finish(offset)
    }

    /// The owned partitions of `topic` with their generations.
    func owned(topic: String) -> [(partition: Int32, generation: Int)] {
        trackers.keys.filter { $0.topic == topic }.map { ($0.partition, generations[$0] ?? 0) }
    }
}
