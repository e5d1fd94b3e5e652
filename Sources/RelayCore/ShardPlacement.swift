/// Which shard each partition number's work is on, decided as the number is assigned.
///
/// A number not placed yet goes to the shard with the fewest numbers (the lowest index among
/// equals), numbers of one assignment in ascending order; it stays there while a partition of
/// that number, of any lane, is ours, so that a device's intents of every lane (keyed by its
/// token, one partition number per lane) meet in one shard's queues. Once the last of them is
/// revoked the number is free, and its next assignment places it anew.
///
/// Placing by the number alone (its number modulo the shard count) would leave shards idle
/// whenever a relay's numbers share a residue: two relays of a group, one with the even numbers
/// and one with the odd, would each send from half their event loops.
///
/// Work of a number that moved is not mixed up with the work after it: each shard's ledger hands
/// out generations of its own (``PartitionLedger/shard(ofGeneration:shards:)``), so an item ends
/// on the shard its generation names and never passes as the new shard's. A device's intent of
/// the old assignment still at APNs is not serialized with one of the new assignment on another
/// shard: a revocation waits for its partitions' work at APNs (within its bound) before the
/// consumer goes on, but a lost assignment (or a wait that ran out) does not, as it never did
/// for the relay the partition went to.
///
/// Under the cooperative assignor, a revocation of some numbers leaves the others where they
/// are: the shards can be uneven until later assignments fill the emptier ones.
public struct ShardPlacement: Sendable {
    /// The shard count.
    public let shards: Int
    /// Per placed number: its shard, and the topics whose partition of that number are ours.
    private var placed: [Int32: (shard: Int, topics: Set<String>)] = [:]
    /// Per shard, the numbers placed on it.
    public private(set) var load: [Int]

    public init(shards: Int) {
        self.shards = max(shards, 1)
        self.load = Array(repeating: 0, count: self.shards)
    }

    /// The shard of a placed number; a number not placed (none of its partitions is ours) has
    /// the shard its number modulo the count names, where nothing of it is owned.
    public func shard(of number: Int32) -> Int {
        placed[number]?.shard ?? Int(number.magnitude % UInt32(shards))
    }

    /// Whether a partition of `number` is ours.
    public func isPlaced(_ number: Int32) -> Bool {
        placed[number] != nil
    }

    /// The partitions (topic, number) are ours from now on: each number not placed yet is
    /// placed, in ascending order, on the least loaded shard.
    public mutating func assign(_ partitions: [(topic: String, number: Int32)]) {
        for (topic, number) in partitions.sorted(by: { ($0.number, $0.topic) < ($1.number, $1.topic) }) {
            if placed[number] != nil {
                placed[number]!.topics.insert(topic)
                continue
            }
            // The first of the least loaded.
            var shard = 0
            for index in load.indices where load[index] < load[shard] { shard = index }
            load[shard] += 1
            placed[number] = (shard, [topic])
        }
    }

    /// The partitions are no longer ours: a number none of whose partitions is left is free.
    public mutating func revoke(_ partitions: [(topic: String, number: Int32)]) {
        for (topic, number) in partitions {
            guard var place = placed[number] else { continue }
            place.topics.remove(topic)
            if place.topics.isEmpty {
                placed[number] = nil
                load[place.shard] -= 1
            } else {
                placed[number] = place
            }
        }
    }
}
