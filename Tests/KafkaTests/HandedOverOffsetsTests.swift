import Kafka
import Testing

/// Records librdkafka delivers a second time within one assignment are skipped; a new
/// assignment starts afresh.
@Suite("Handed-over offsets")
struct HandedOverOffsetsTests {
    let p0 = TopicPartition(topic: "t", partition: 0)
    let p1 = TopicPartition(topic: "t", partition: 1)

    @Test func aRewindWithinAnAssignmentIsSkippedUntilItCatchesUp() {
        var offsets = HandedOverOffsets()
        for offset in 0..<5 { #expect(offsets.accept(p0, offset: Int64(offset)) == .new) }
        #expect(offsets.accept(p1, offset: 7) == .new, "partitions are apart; the first offset may be anything")
        // librdkafka goes back to 0: the five records handed over are skipped, the rewind is
        // reported once, and reading goes on at 5.
        #expect(offsets.accept(p0, offset: 0) == .seen(rewound: true))
        for offset in 1..<5 { #expect(offsets.accept(p0, offset: Int64(offset)) == .seen(rewound: false)) }
        #expect(offsets.accept(p0, offset: 5) == .new)
        #expect(offsets.position(p0) == 6)
        // A gap forward is the broker's to decide (compaction, a trimmed log): accepted.
        #expect(offsets.accept(p0, offset: 9) == .new)
        #expect(offsets.accept(p0, offset: 3) == .seen(rewound: true))
        #expect(offsets.accept(p1, offset: 7) == .seen(rewound: true))
    }

    @Test func aNewAssignmentStartsWhereverTheCommittedOffsetIs() {
        var offsets = HandedOverOffsets()
        for offset in 0..<5 { _ = offsets.accept(p0, offset: Int64(offset)) }
        _ = offsets.accept(p1, offset: 3)
        offsets.reset([p0])
        #expect(offsets.position(p0) == nil && offsets.position(p1) == 4)
        #expect(offsets.accept(p0, offset: 2) == .new, "the next owner starts from the committed offset")
        offsets.resetAll()
        #expect(offsets.accept(p1, offset: 0) == .new)
    }
}
