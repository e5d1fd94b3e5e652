import Kafka
import PropertyBased
@testable import Relay
import Testing

@Suite("Offset tracker", .timeLimit(.minutes(3)))
struct OffsetTrackerTests {
    @Test func theCommittablePositionMovesOnlyPastOffsetsFinishedWithEverythingBeforeThem() {
        var tracker = OffsetTracker()
        func finish(_ offset: Int64) -> Int64? { tracker.finish(offset) }
        for offset in [10, 11, 12, 15] as [Int64] { tracker.started(offset) }
        #expect(tracker.inFlight == 4)
        #expect(finish(12) == nil)
        #expect(finish(11) == nil)
        #expect(tracker.committable == nil)
        #expect(finish(10) == 12)
        #expect(tracker.committable == 12)
        #expect(tracker.inFlight == 1)
        #expect(finish(15) == 15)
        #expect(tracker.inFlight == 0)
    }

    /// Whatever order offsets finish in, the committable position never passes an unfinished
    /// offset, and it reaches the last one once all finished. Offsets start anywhere and have
    /// gaps (as compacted or transactional topics have); the finish order comes from a random
    /// rank per offset.
    @Test func neverPassesAnUnfinishedOffsetWhateverTheFinishOrder() async {
        await propertyCheck(count: 300, input: Gen.int64(in: 0...999), Gen.int64(in: 1...3).array(of: 1...50),
                            Gen.int(in: 0...1000).array(of: 50...50)) { first, gaps, ranks in
            var offsets: [Int64] = []
            var next = first
            for gap in gaps {
                offsets.append(next)
                next += gap
            }
            var tracker = OffsetTracker()
            for offset in offsets { tracker.started(offset) }
            let order = offsets.indices.sorted { (ranks[$0], $0) < (ranks[$1], $1) }.map { offsets[$0] }
            var finished = Set<Int64>()
            var last: Int64?
            for offset in order {
                finished.insert(offset)
                if let moved = tracker.finish(offset) {
                    #expect(last.map { moved > $0 } ?? true)
                    last = moved
                }
                if let committable = tracker.committable {
                    #expect(offsets.filter { $0 <= committable }.allSatisfy(finished.contains))
                    // And it is as far as it may go: the next offset is unfinished.
                    if let following = offsets.first(where: { $0 > committable }) { #expect(!finished.contains(following)) }
                } else {
                    #expect(!finished.contains(offsets[0]))
                }
            }
            #expect(tracker.committable == offsets.last)
            #expect(tracker.inFlight == 0)
        }
    }
}

@Suite("Partition ledger", .timeLimit(.minutes(3)))
struct PartitionLedgerTests {
    static let p0 = TopicPartition(topic: "apns.intents", partition: 0)
    static let p1 = TopicPartition(topic: "apns.intents", partition: 1)

    @Test func offsetsOfPartitionsNotOwnedAreNotStarted() {
        var ledger = PartitionLedger<TopicPartition>()
        #expect(ledger.start(Self.p0, offset: 5) == nil)
        ledger.assign([Self.p0])
        #expect(ledger.start(Self.p0, offset: 5) == 1)
        #expect(ledger.start(Self.p1, offset: 5) == nil)
    }

    @Test func workOfAnEarlierOwnershipIsNoLongerOursEvenOnceThePartitionCameBack() {
        var ledger = PartitionLedger<TopicPartition>()
        ledger.assign([Self.p0, Self.p1])
        let first = ledger.start(Self.p0, offset: 10)
        #expect(first == 1)
        #expect(ledger.start(Self.p0, offset: 11) == 1)
        ledger.revoke([Self.p0])
        #expect(!ledger.owns(Self.p0, generation: 1))
        #expect(ledger.finish(Self.p0, generation: 1, offset: 10) == nil)
        ledger.assign([Self.p0])
        #expect(!ledger.owns(Self.p0, generation: 1))
        #expect(ledger.owns(Self.p0, generation: 3))
        // The old generation's offsets are not the new tracker's.
        #expect(ledger.finish(Self.p0, generation: 1, offset: 11) == nil)
        #expect(ledger.start(Self.p0, offset: 10) == 3)
        #expect(ledger.finish(Self.p0, generation: 3, offset: 10) == 10)
        // Revoking one partition leaves the other alone.
        #expect(ledger.owns(Self.p1, generation: 1))
        #expect(ledger.owned { $0.topic == "apns.intents" }.sorted { $0.partition.partition < $1.partition.partition }.map(\.generation) == [3, 1])
        #expect(ledger.owned { $0.topic == "other" }.isEmpty)
    }

    /// Review 3.4: one stuck offset keeps every later one uncommitted; past the limit the
    /// partition is held (paused) once, and released once half of them are committable.
    @Test func aPartitionWithTooManyUncommittedOffsetsIsHeldUntilHalfAreCommittable() {
        var ledger = PartitionLedger<TopicPartition>(uncommittedLimit: 10)
        ledger.assign([Self.p0, Self.p1])
        var holds = 0, otherHolds = 0, releases = 0, committed: [Int64] = []
        for offset in 0..<20 as Range<Int64> {
            _ = ledger.start(Self.p0, offset: offset)
            if ledger.holdIfFull(Self.p0) { holds += 1 }
            if ledger.holdIfFull(Self.p1) { otherHolds += 1 }
            // Everything but the first finishes at once: it stays uncommitted behind offset 0.
            if offset > 0, let moved = ledger.finish(Self.p0, generation: 1, offset: offset) { committed.append(moved) }
            if ledger.releaseIfDrained(Self.p0) { releases += 1 }
        }
        #expect(holds == 1)
        #expect(otherHolds == 0)
        #expect(releases == 0)
        #expect(committed.isEmpty)
        #expect(ledger.held == [Self.p0])
        // The stuck one finishes: everything is committable, the partition is released once.
        let moved = ledger.finish(Self.p0, generation: 1, offset: 0)
        #expect(moved == 19)
        let first = ledger.releaseIfDrained(Self.p0), second = ledger.releaseIfDrained(Self.p0)
        #expect(first && !second)
        #expect(ledger.held.isEmpty)
        // A held partition that is revoked is no longer held.
        for offset in 20..<30 as Range<Int64> { _ = ledger.start(Self.p0, offset: offset) }
        let heldAgain = ledger.holdIfFull(Self.p0)
        #expect(heldAgain)
        ledger.revoke([Self.p0])
        #expect(ledger.held.isEmpty)
    }

    /// A revocation can come while the partition's assignment still waits behind consumed
    /// batches: the mark holds from then on, and only the revocation itself lifts it.
    @Test func aPartitionRevokedBeforeItsAssignmentArrivedStartsNothing() {
        var ledger = PartitionLedger<TopicPartition>()
        ledger.markRevoking([Self.p0])
        ledger.assign([Self.p0])
        #expect(ledger.start(Self.p0, offset: 1) == nil)
        #expect(!ledger.isActive(Self.p0, generation: 1))
        #expect(ledger.settled(ledger.revoking))
        ledger.revoke([Self.p0])
        ledger.assign([Self.p0])
        #expect(ledger.start(Self.p0, offset: 1) == 3)
    }

    @Test func theCommittableOffsetMovesInOrder() {
        var ledger = PartitionLedger<TopicPartition>()
        ledger.assign([Self.p0])
        for offset in 0..<3 as Range<Int64> { _ = ledger.start(Self.p0, offset: offset) }
        #expect(ledger.finish(Self.p0, generation: 1, offset: 1) == nil)
        #expect(ledger.finish(Self.p0, generation: 1, offset: 0) == 1)
        #expect(ledger.finish(Self.p0, generation: 1, offset: 2) == 2)
    }
}
