import Common
import Foundation
import Testing

@Suite("Locked", .timeLimit(.minutes(1)))
struct LockedTests {
    /// A value several threads change in turn under the lock ends with every change, and (run by
    /// `scripts/test --sanitize=thread`) the sanitizer sees each section ordered after the one
    /// before: with a bare futex-based `Mutex` it reported this test's value as raced.
    @Test func sectionsOnSeveralThreadsAreOrdered() async {
        final class Counter: Sendable {
            let value = Locked((count: 0, lastThread: ""))
        }
        let counter = Counter(), threads = 4, increments = 5_000
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<threads {
                group.addTask {
                    // Real threads, not the cooperative pool: each its own, side by side.
                    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                        Thread.detachNewThread {
                            for _ in 0..<increments {
                                counter.value.withLock { $0.count += 1; $0.lastThread = "thread \(index)" }
                            }
                            done.resume()
                        }
                    }
                }
            }
        }
        #expect(counter.value.withLock { $0.count } == threads * increments)
    }

    /// What a section throws reaches its caller, and the value keeps what the section changed.
    @Test func aThrowingSectionRethrowsAndKeepsItsChanges() {
        struct Refused: Error {}
        let value = Locked(1)
        #expect(throws: Refused.self) {
            try value.withLock { (number: inout Int) throws(Refused) in
                number = 2
                throw Refused()
            }
        }
        #expect(value.withLock { $0 } == 2)
    }
}

@Suite("Locked function", .timeLimit(.minutes(1)))
struct LockedFunctionTests {
    /// Read a thousand times, the function is called through as few frames as at first.
    @Test func readsLeaveTheFunctionAsItWas() {
        let depths = Locked<[Int]>([])
        let function = LockedFunction<@Sendable () -> Void>({ depths.withLock { $0.append(Thread.callStackSymbols.count) } })
        for _ in 0..<1_000 { function.current?() }
        let seen = depths.withLock { $0 }
        #expect(seen.count == 1_000 && Set(seen).count == 1, "\(seen.first ?? 0) frames at first, \(seen.last ?? 0) at last")
        function.set(nil)
        #expect(function.current == nil)
        function.set { depths.withLock { $0 = [-1] } }
        function.current?()
        #expect(depths.withLock { $0 } == [-1])
    }
}
