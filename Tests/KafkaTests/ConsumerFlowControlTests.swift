import Kafka
import Testing

/// The consumer's flow control step by step, on made-up instants.
@Suite("Consumer flow control", .timeLimit(.minutes(3)))
struct ConsumerFlowControlTests {
    let p0 = TopicPartition(topic: "t", partition: 0)
    let p1 = TopicPartition(topic: "t", partition: 1)
    let p2 = TopicPartition(topic: "t", partition: 2)
    let start = ContinuousClock.now

    func flow() -> ConsumerFlowControl {
        var flow = ConsumerFlowControl(capacity: 100, holdLimit: .seconds(5))
        #expect(flow.assigned([p1, p0, p2]) == [])
        return flow
    }

    @Test func belowCapacityPollingGoesOn() {
        var flow = flow()
        #expect(flow.decide(buffered: 0, now: start) == .poll)
        #expect(flow.decide(buffered: 99, now: start) == .poll)
    }

    @Test func aFullBufferHoldsPollingUntilTheApplicationIsDownToHalf() {
        var flow = flow()
        #expect(flow.decide(buffered: 100, now: start) == .hold)
        #expect(flow.decide(buffered: 80, now: start + .seconds(1)) == .hold)
        #expect(flow.decide(buffered: 51, now: start + .seconds(2)) == .hold)
        #expect(flow.decide(buffered: 50, now: start + .seconds(3)) == .poll)
        #expect(!flow.bufferFull)
        // Nothing was paused, so nothing resumes.
        #expect(flow.decide(buffered: 10, now: start + .seconds(4)) == .poll)
    }

    @Test func holdingTooLongPausesEveryAssignedPartitionAndResumesAtHalf() {
        var flow = flow()
        #expect(flow.decide(buffered: 150, now: start) == .hold)
        #expect(flow.decide(buffered: 120, now: start + .milliseconds(4999)) == .hold)
        #expect(flow.decide(buffered: 120, now: start + .seconds(5)) == .pause([p0, p1, p2]))
        #expect(flow.bufferFull)
        // Paused: polling goes on (rebalances, the session), no second pause, no hold.
        #expect(flow.decide(buffered: 200, now: start + .seconds(6)) == .poll)
        #expect(flow.decide(buffered: 51, now: start + .seconds(7)) == .poll)
        #expect(flow.decide(buffered: 50, now: start + .seconds(8)) == .resume([p0, p1, p2]))
        #expect(!flow.bufferFull)
        #expect(flow.decide(buffered: 50, now: start + .seconds(9)) == .poll)
    }

    @Test func partitionsAssignedWhileFullStartPausedAndRevokedOnesAreForgotten() {
        var flow = flow()
        _ = flow.decide(buffered: 100, now: start)
        #expect(flow.decide(buffered: 100, now: start + .seconds(5)) == .pause([p0, p1, p2]))
        let p3 = TopicPartition(topic: "t", partition: 3)
        #expect(flow.assigned([p3]) == [p3])
        // Paused in librdkafka: resumed as it is revoked.
        #expect(flow.revoked([p1]) == [p1])
        #expect(flow.decide(buffered: 0, now: start + .seconds(6)) == .resume([p0, p2, p3]))
        #expect(flow.assigned([p1]) == [])
    }

    @Test func theApplicationsPausesOutliveTheBuffersAndItsResumesWaitForIt() {
        var flow = flow()
        flow.applicationPaused([p1])
        #expect(flow.applicationChanges() == ([p1], []))
        flow.applicationResumed([p1])
        #expect(flow.applicationChanges() == ([], [p1]))
        flow.applicationPaused([p1])
        #expect(flow.applicationChanges() == ([p1], []))
        _ = flow.decide(buffered: 100, now: start)
        #expect(flow.decide(buffered: 100, now: start + .seconds(5)) == .pause([p0, p1, p2]))
        // Resumed by the application while the buffer is full: it waits for the buffer.
        flow.applicationPaused([p2])
        flow.applicationResumed([p2])
        #expect(flow.applicationChanges() == ([], []))
        // The buffer drains: everything but what the application still holds resumes.
        #expect(flow.decide(buffered: 0, now: start + .seconds(6)) == .resume([p0, p2]))
        #expect(flow.pausedByApplication == [p1])
        #expect(flow.paused == [p1])
        #expect(flow.applicationChanges() == ([], []))
    }

    /// The application's wishes are applied by the poll thread, the last one winning: a pause
    /// resumed before the poll thread's turn costs librdkafka nothing, a partition not (or no
    /// longer) assigned is never paused, and a revocation resumes only what librdkafka has
    /// paused.
    @Test func theApplicationsWishesAreAppliedOnThePollThreadsTurn() {
        var flow = flow()
        flow.applicationPaused([p0, p1])
        flow.applicationResumed([p0])
        #expect(flow.applicationChanges() == ([p1], []))
        #expect(flow.applicationChanges() == ([], []))
        let p3 = TopicPartition(topic: "t", partition: 3)
        flow.applicationPaused([p2, p3])
        #expect(flow.revoked([p2]) == [])
        #expect(flow.applicationChanges() == ([], []))
        #expect(flow.paused == [p1])
        #expect(flow.revoked([p1]) == [p1])
        #expect(flow.paused.isEmpty)
        // Assigned again: it is not paused unless the application asks again, and neither is
        // one wished paused while it was not assigned.
        #expect(flow.assigned([p1, p3]) == [])
        #expect(flow.applicationChanges() == ([], []))
        // A wish whose partition is revoked ends with its assignment.
        flow.applicationPaused([p3])
        #expect(flow.revoked([p3]) == [])
        #expect(flow.assigned([p3]) == [])
        #expect(flow.applicationChanges() == ([], []))
        #expect(flow.pausedByApplication.isEmpty)
    }

    @Test func aLostAssignmentIsReportedOnceAndForgotten() {
        var flow = flow()
        flow.applicationPaused([p0])
        _ = flow.applicationChanges()
        let lost = flow.lostAssignment()
        #expect(lost.assigned == [p0, p1, p2] && lost.paused == [p0])
        #expect(flow.lostAssignment() == ([], []))
        #expect(flow.pausedByApplication.isEmpty && flow.paused.isEmpty)
    }

    @Test func closingEndsAHold() {
        var flow = flow()
        #expect(flow.decide(buffered: 100, now: start) == .hold)
        flow.closing()
        // Nobody reads the buffer any more: never hold again, however full it stays.
        #expect(flow.decide(buffered: 100, now: start + .seconds(1)) == .poll)
        #expect(flow.decide(buffered: 500, now: start + .seconds(10)) == .poll)
    }
}
