import Common
import Testing

@Suite("Retry", .timeLimit(.minutes(3)))
struct RetryTests {
    struct Failed: Error {}
    static let quick = Backoff(base: .milliseconds(1), maximum: .milliseconds(4), jitter: false)

    @Test func triesUntilAnAttemptSucceedsTellingEachFailureItsCount() async {
        var attempts = 0
        var heard: [Int] = []
        let result = await Retry(backoff: Self.quick).run { () throws(Failed) -> String in
            attempts += 1
            if attempts < 4 { throw Failed() }
            return "done"
        } failed: { _, count in
            heard.append(count)
            return .retry
        }
        #expect(result == "done")
        #expect(attempts == 4)
        #expect(heard == [1, 2, 3])
    }

    @Test func givesUpWhenTheCallerSaysSo() async {
        var attempts = 0
        let result: Int? = await Retry(backoff: Self.quick).run { () throws(Failed) -> Int in
            attempts += 1
            throw Failed()
        } failed: { _, count in count < 2 ? .retry : .giveUp }
        #expect(result == nil)
        #expect(attempts == 2)
    }

    @Test func anOpenedInterruptEndsTheWaitAndGivesUp() async {
        let stopping = AsyncLatch()
        let clock = ContinuousClock()
        let started = clock.now
        let slow = Backoff(base: .seconds(60), maximum: .seconds(60), jitter: false)
        let result: Int? = await Retry(backoff: slow, interrupt: stopping).run { () throws(Failed) -> Int in
            throw Failed()
        } failed: { _, _ in
            stopping.open()
            return .retry
        }
        #expect(result == nil)
        #expect(clock.now - started < .seconds(30))
    }

    @Test func aCancelledTaskGivesUp() async {
        let task = Task {
            await Retry(backoff: Backoff(base: .seconds(60), maximum: .seconds(60))).run { () throws(Failed) -> Int in
                throw Failed()
            } failed: { _, _ in .retry }
        }
        task.cancel()
        #expect(await task.value == nil)
    }
}
