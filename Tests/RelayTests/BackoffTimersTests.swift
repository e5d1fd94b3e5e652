import Common
import NIOCore
import NIOEmbedded
@testable import Relay
import Testing

@Suite("Backoff timers")
struct BackoffTimersTests {
    /// What the timers told each retry, in order: (retry, abandoned).
    final class Fired: Sendable {
        private let calls = Locked<[(Int, Bool)]>([])
        var all: [(Int, Bool)] { calls.withLock { $0 } }
        func callback(_ retry: Int) -> @Sendable (Bool) -> Void {
            { abandoned in self.calls.withLock { $0.append((retry, abandoned)) } }
        }
    }

    @Test func aRetryFiresOnceItsDelayPassed() {
        let loop = EmbeddedEventLoop(), timers = BackoffTimers(), fired = Fired()
        timers.schedule(in: .milliseconds(200), on: loop, fired.callback(1))
        timers.schedule(in: .milliseconds(100), on: loop, fired.callback(2))
        #expect(timers.count == 2)
        loop.advanceTime(by: .milliseconds(150))
        #expect(fired.all.map(\.0) == [2] && fired.all.allSatisfy { !$0.1 })
        #expect(timers.count == 1)
        loop.advanceTime(by: .milliseconds(50))
        #expect(fired.all.map(\.0) == [2, 1] && fired.all.allSatisfy { !$0.1 })
        #expect(timers.count == 0)
    }

    /// The shutdown deadline tells every waiting retry at once; their timers never fire, and a
    /// retry scheduled afterwards is told at once.
    @Test func theDeadlineAbandonsEveryWaitingRetryAndEveryLaterOne() {
        let loop = EmbeddedEventLoop(), timers = BackoffTimers(), fired = Fired()
        timers.schedule(in: .seconds(60), on: loop, fired.callback(1))
        timers.schedule(in: .seconds(30), on: loop, fired.callback(2))
        timers.schedule(in: .milliseconds(10), on: loop, fired.callback(3))
        loop.advanceTime(by: .milliseconds(10))
        timers.abandonAll()
        #expect(timers.count == 0)
        #expect(fired.all.count == 3)
        #expect(fired.all.first.map { $0.0 == 3 && !$0.1 } == true)
        #expect(Set(fired.all.dropFirst().map(\.0)) == [1, 2] && fired.all.dropFirst().allSatisfy(\.1))
        loop.advanceTime(by: .seconds(120))
        #expect(fired.all.count == 3)
        timers.schedule(in: .seconds(1), on: loop, fired.callback(4))
        #expect(fired.all.count == 4 && fired.all.last.map { $0.0 == 4 && $0.1 } == true)
        #expect(timers.count == 0)
    }
}
