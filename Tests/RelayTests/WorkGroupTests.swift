@testable import Relay
import Testing

/// How a lane batch's records are cut into work groups (``RelayPipeline/workGroups(_:shards:size:)``):
/// each group one shard's, on that shard's loop, its records in the batch's order.
@Suite("Work groups")
struct WorkGroupTests {
    typealias Pipeline = RelayPipeline

    /// Two shards: partitions 0 and 2 are shard 0's, 1 and 3 shard 1's. Groups of at most two,
    /// the shards in turn, each shard's records in their order.
    @Test func aBatchIsCutIntoGroupsOfOneShardEachInTurn() {
        let groups = Pipeline.workGroups([0, 1, 2, 3, 0, 1, 0, 2], shards: 2, size: 2)
        #expect(groups.map(\.shard) == [0, 1, 0, 1, 0])
        #expect(groups.map { Array($0.indices) } == [[0, 2], [1, 3], [4, 6], [5], [7]])
    }

    /// One shard: the batch's consecutive records, as many groups as the size makes.
    @Test func withOneShardTheGroupsAreConsecutiveRecords() {
        let groups = Pipeline.workGroups([3, 1, 2, 0, 1], shards: 1, size: 2)
        #expect(groups.map(\.shard) == [0, 0, 0])
        #expect(groups.map { Array($0.indices) } == [[0, 1], [2, 3], [4]])
    }

    /// An empty batch has no group, a shard without records none either; every record is in
    /// exactly one group, of its partition's shard, and each shard's records keep the batch's
    /// order across its groups.
    @Test func everyRecordIsInOneGroupOfItsShardInOrder() {
        #expect(Pipeline.workGroups([], shards: 3, size: 128).isEmpty)
        #expect(Pipeline.workGroups([0, 3, 6], shards: 3, size: 128).map(\.shard) == [0])
        let partitions: [Int32] = (0..<1000).map { Int32(($0 * 7 + $0 / 13) % 16) }
        let groups = Pipeline.workGroups(partitions, shards: 3, size: 128)
        #expect(groups.allSatisfy { !$0.indices.isEmpty && $0.indices.count <= 128 })
        #expect(groups.flatMap(\.indices).sorted() == Array(0..<1000))
        #expect(groups.allSatisfy { group in group.indices.allSatisfy { Int(partitions[$0]) % 3 == group.shard } })
        for shard in 0..<3 {
            let indices = groups.filter { $0.shard == shard }.flatMap(\.indices)
            #expect(indices == indices.sorted(), "shard \(shard)")
        }
    }
}
