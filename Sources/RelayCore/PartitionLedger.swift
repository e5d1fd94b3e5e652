/// The partitions this relay owns and where each one's work stands: per partition an
/// ``OffsetTracker`` and a generation, bumped at every assignment and revocation, so that work
/// started under an earlier ownership is known as no longer ours even once the partition came
/// back. A ledger among several (one per pipeline shard) hands out generations of its own: the
/// ledger `shard` of `shards` only those that leave `shard` divided by `shards` (``shard(ofGeneration:shards:)``),
/// so a generation names its ledger, and work of one never passes as another's when a
/// partition moves between them. A value type: each pipeline shard keeps one, confined to its event loop, and stores the committable
/// offsets it returns. Generic over what names a partition (the relay's is Kafka's
/// `TopicPartition`), so that this module needs no Kafka; public with inlinable methods, so that
/// the relay's use is specialized (docs/architecture.md, hot-path rule 4).
///
/// One unfinished offset keeps every later one of its partition uncommitted, and the tracker
/// holds them all. Past `uncommittedLimit` of them the partition is *held*: the pipeline
/// pauses it until the tracker is down to half (``holdIfFull(_:)``, ``releaseIfDrained(_:)``),
/// so memory stays bounded whatever the throughput.
public struct PartitionLedger<Partition: Hashable & Sendable>: Sendable {
    @usableFromInline var trackers: [Partition: OffsetTracker] = [:]
    @usableFromInline var generations: [Partition: Int] = [:]
    public let uncommittedLimit: Int
    /// The generations this ledger hands out: `first`, then every `stride` after it.
    @usableFromInline let firstGeneration: Int
    @usableFromInline let generationStride: Int
    /// Partitions paused because they reached the limit.
    @inlinable public var held: Set<Partition> { heldPartitions }
    @usableFromInline var heldPartitions: Set<Partition> = []
    /// Partitions librdkafka is taking away: no new work of theirs starts, the work that
    /// reached APNs finishes (its offsets are still stored) before the revocation is
    /// acknowledged (``markRevoking(_:)``, ``settled(_:)``).
    @inlinable public var revoking: Set<Partition> { revokingPartitions }
    @usableFromInline var revokingPartitions: Set<Partition> = []
    /// Per partition, its items whose notification went to APNs and that have not ended.
    @usableFromInline var atAPNs: [Partition: Int] = [:]

    /// The ledger `shard` of `shards` (one ledger alone: 0 of 1).
    public init(uncommittedLimit: Int = .max, shard: Int = 0, of shards: Int = 1) {
        self.uncommittedLimit = max(uncommittedLimit, 2)
        self.generationStride = max(shards, 1)
        self.firstGeneration = generationStride + shard
    }

    /// The ledger among `shards` that handed out `generation`.
    @inlinable
    public static func shard(ofGeneration generation: Int, shards: Int) -> Int {
        let remainder = generation % shards
        return remainder < 0 ? remainder + shards : remainder
    }

    /// The partition's next generation.
    @inlinable
    mutating func bumpGeneration(_ partition: Partition) {
        if let generation = generations[partition] {
            generations[partition] = generation + generationStride
        } else {
            generations[partition] = firstGeneration
        }
    }

    /// The partitions are ours from now on (a new generation each).
    @inlinable
    public mutating func assign(_ partitions: [Partition]) {
        for partition in partitions {
            trackers[partition] = OffsetTracker()
            bumpGeneration(partition)
        }
    }

    /// The partitions are no longer ours: their work in flight is abandoned (its offsets are
    /// never stored).
    @inlinable
    public mutating func revoke(_ partitions: [Partition]) {
        for partition in partitions {
            trackers[partition] = nil
            bumpGeneration(partition)
            heldPartitions.remove(partition)
            revokingPartitions.remove(partition)
            atAPNs[partition] = nil
        }
    }

    /// The partitions this relay owns now.
    @inlinable
    public var owned: [Partition] { Array(trackers.keys) }

    /// librdkafka is revoking `partitions`: from now on none of their work starts, even when
    /// their assignment has not reached the ledger yet (it waits behind consumed batches); the
    /// mark stays until the revocation itself arrives (``revoke(_:)``).
    @inlinable
    public mutating func markRevoking(_ partitions: [Partition]) {
        revokingPartitions.formUnion(partitions)
    }

    /// True when none of `partitions` has work at APNs here.
    @inlinable
    public func settled(_ partitions: some Sequence<Partition>) -> Bool {
        partitions.allSatisfy { (atAPNs[$0] ?? 0) == 0 }
    }

    /// Whether work started under `generation` may go on to APNs: its partition is ours and
    /// not being revoked.
    @inlinable
    public func isActive(_ partition: Partition, generation: Int) -> Bool {
        owns(partition, generation: generation) && !revokingPartitions.contains(partition)
    }

    /// A notification of this work goes to APNs (counted once per item: `first`). False when
    /// it must not (the partition is not active): then nothing was counted.
    @inlinable
    public mutating func sendBegins(_ partition: Partition, generation: Int, first: Bool) -> Bool {
        guard isActive(partition, generation: generation) else { return false }
        if first { atAPNs[partition, default: 0] += 1 }
        return true
    }

    /// Work counted by ``sendBegins(_:generation:first:)`` ended (its offset stored or not).
    @inlinable
    public mutating func sentWorkEnded(_ partition: Partition, generation: Int) {
        guard generations[partition] == generation, let count = atAPNs[partition] else { return }
        atAPNs[partition] = count > 1 ? count - 1 : nil
    }

    /// True when `partition` just reached the limit of uncommitted offsets: to be paused.
    @inlinable
    public mutating func holdIfFull(_ partition: Partition) -> Bool {
        guard let tracker = trackers[partition], tracker.uncommitted >= uncommittedLimit else { return false }
        return heldPartitions.insert(partition).inserted
    }

    /// True when a held partition is down to half the limit: to be resumed.
    @inlinable
    public mutating func releaseIfDrained(_ partition: Partition) -> Bool {
        guard heldPartitions.contains(partition), (trackers[partition]?.uncommitted ?? 0) <= uncommittedLimit / 2 else { return false }
        heldPartitions.remove(partition)
        return true
    }

    /// An offset of an owned partition starts: its generation, or nil when the partition is not
    /// ours (the message is dropped), or not since `expected` (the generation it was consumed
    /// under, when the caller knows it: a message consumed before a revocation never starts
    /// under the partition's next assignment).
    @inlinable
    public mutating func start(_ partition: Partition, offset: Int64, generation expected: Int? = nil) -> Int? {
        guard trackers[partition] != nil, !revokingPartitions.contains(partition), let generation = generations[partition],
              expected == nil || expected == generation else { return nil }
        Self.update(&trackers, partition) { $0.started(offset) }
        return generation
    }

    /// Whether work started under `generation` is still ours.
    @inlinable
    public func owns(_ partition: Partition, generation: Int) -> Bool {
        trackers[partition] != nil && generations[partition] == generation
    }

    /// An offset's work ended: the partition's new committable offset when it moved (nil when
    /// it did not, or the work is no longer ours).
    @inlinable
    public mutating func finish(_ partition: Partition, generation: Int, offset: Int64) -> Int64? {
        guard owns(partition, generation: generation) else { return nil }
        return Self.update(&trackers, partition) { $0.finish(offset) } ?? nil
    }

    /// Changes `partition`'s tracker in place, if there is one. Not `trackers[partition]?.…`:
    /// that goes through three nested `_modify` coroutines whose frames, too large for the
    /// caller's buffer for an `OffsetTracker`, are each allocated on the heap (six allocations
    /// per intent, counted with `bench e2e`'s `allocations_per_intent`, docs/performance.md);
    /// a value reached by its index is changed where it is stored.
    @inlinable
    static func update<R>(_ trackers: inout [Partition: OffsetTracker], _ partition: Partition,
                                  _ change: (inout OffsetTracker) -> R) -> R? {
        guard let index = trackers.index(forKey: partition) else { return nil }
        return change(&trackers.values[index])
    }

    /// The partition's current generation, if it is ours.
    @inlinable
    public func generation(of partition: Partition) -> Int? {
        trackers[partition] != nil ? generations[partition] : nil
    }

    /// The owned partitions that `include` picks (those of one topic, say), with their generations.
    @inlinable
    public func owned(where include: (Partition) -> Bool) -> [(partition: Partition, generation: Int)] {
        trackers.keys.filter(include).map { ($0, generations[$0] ?? 0) }
    }
}
