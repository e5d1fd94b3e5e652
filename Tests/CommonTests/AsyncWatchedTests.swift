import Common
import Testing
import TestSupport

@Suite("AsyncWatched", .timeLimit(.minutes(3)))
struct AsyncWatchedTests {
    /// Waiters go on when their own condition holds, not at every change; one whose condition
    /// holds already does not wait at all.
    @Test func eachWaiterGoesOnWhenItsConditionHolds() async {
        let count = AsyncWatched(0)
        let three = Task { await count.wait(atMost: .seconds(60)) { $0 >= 3 } }
        let five = Task { await count.wait(atMost: .seconds(60)) { $0 >= 5 } }
        for _ in 0..<3 { count.update { $0 += 1 } }
        #expect(await three.value)
        #expect(count.value == 3)
        for _ in 0..<2 { count.update { $0 += 1 } }
        #expect(await five.value)
        #expect(await count.wait(atMost: .zero) { $0 == 5 })
        #expect(count.update { value -> Int in value = 0; return 7 } == 7)
    }

    /// A wait ends false at its duration, never before, or when its task is cancelled.
    @Test func aWaitEndsAtItsDurationOrWhenCancelled() async {
        let watched = AsyncWatched<String?>(nil)
        let clock = ContinuousClock()
        let started = clock.now
        #expect(await watched.wait(atMost: .milliseconds(50)) { $0 != nil } == false)
        #expect(clock.now - started >= .milliseconds(50))
        let waiter = Task { await watched.wait(atMost: .seconds(60)) { $0 != nil } }
        waiter.cancel()
        #expect(await waiter.value == false)
        // A later change resumes nothing left behind.
        watched.update { $0 = "set" }
        #expect(watched.value == "set")
    }

    /// A wait that times out says where, what it waited for (its source line) and the value
    /// it saw last; so does a polling one, without the value.
    @Test func aTimedOutWaitSaysWhatItWaitedForAndWhatItSaw() async {
        let count = AsyncWatched(3)
        let line = #line + 2
        do {
            try await count.waitUntil(timeout: .milliseconds(30)) { $0 > 5 }
            Issue.record("no timeout")
        } catch {
            #expect("\(error)".hasSuffix("AsyncWatchedTests.swift:\(line) did not hold within 0.03 seconds: try await count.waitUntil(timeout: .milliseconds(30)) { $0 > 5 }; last seen: 3"), "\(error)")
        }
        do {
            try await waitUntil(timeout: .milliseconds(30)) { count.value > 5 }
            Issue.record("no timeout")
        } catch {
            #expect("\(error)".hasSuffix("did not hold within 0.03 seconds: try await waitUntil(timeout: .milliseconds(30)) { count.value > 5 }"), "\(error)")
        }
    }
}
