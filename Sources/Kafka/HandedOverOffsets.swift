/// Per partition, the offset after the last record the consumer handed over in the partition's
/// current assignment: a record below it was handed over already and is not handed over again.
///
/// librdkafka 2.0 can go back to a partition's start position while it is being read: a pause
/// and resume from another thread during the partition's first offset lookup starts a second
/// lookup, whose late answer moves the fetch position back (seen as every record from offset 0
/// read a second time, hundreds of records in). The application would take those as new work.
/// Rebalances reset a partition's entry (its next owner starts from the committed offset), so
/// only a rewind within one assignment is skipped.
///
/// A log truncated below what was read, with new records written at the old offsets while the
/// partition stays assigned, would be skipped up to the mark: only an unclean leader election
/// does that (`unclean.leader.election.enable`, off by default, which an at-least-once pipeline
/// cannot have on anyway: it drops acknowledged records). docs/operations.md says so.
///
/// Poll thread only (the rebalance callback runs there too): no lock.
public struct HandedOverOffsets: Sendable {
    public enum Verdict: Equatable, Sendable {
        /// New in this assignment: it counts as handed over now.
        case new
        /// Handed over already; `rewound` for the first such record after a new one (where
        /// librdkafka went back).
        case seen(rewound: Bool)
    }

    private var next: [TopicPartition: Int64] = [:]

    public init() {}
    /// Partitions whose last record was one handed over already.
    private var repeating: Set<TopicPartition> = []

    /// Whether a record at `offset` of `partition` is new in this assignment.
    public mutating func accept(_ partition: TopicPartition, offset: Int64) -> Verdict {
        if let expected = next[partition], offset < expected {
            return .seen(rewound: repeating.insert(partition).inserted)
        }
        next[partition] = offset + 1
        if !repeating.isEmpty { repeating.remove(partition) }
        return .new
    }

    /// Where `partition` stands (the offset after the last record handed over), if it has any.
    public func position(_ partition: TopicPartition) -> Int64? {
        next[partition]
    }

    /// Forgets `partitions`: they were assigned anew or revoked.
    public mutating func reset(_ partitions: [TopicPartition]) {
        for partition in partitions {
            next[partition] = nil
            repeating.remove(partition)
        }
    }

    /// Forgets every partition (the whole assignment was lost).
    public mutating func resetAll() {
        next.removeAll()
        repeating.removeAll()
    }
}
