import Synchronization

/// A one-shot event any number of tasks can wait for: ``open()`` once, and every waiter, past and
/// future, goes on. A waiting task that is cancelled stops waiting (``wait()`` returns false).
public final class AsyncLatch: Sendable {
    private struct State {
        var isOpen = false
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Bool, Never>] = [:]
    }

    private let state = Locked(State())
    /// ``State/isOpen`` for ``isOpen``, read without the lock (once per intent on some paths).
    private let opened = Atomic<Bool>(false)

    public init() {}

    public var isOpen: Bool { opened.load(ordering: .acquiring) }

    /// Lets every waiter go on; later calls do nothing.
    public func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            guard !state.isOpen else { return [] }
            state.isOpen = true
            opened.store(true, ordering: .releasing)
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// Waits until the latch is open (true) or this task is cancelled (false).
    @discardableResult
    public func wait() async -> Bool {
        let id = state.withLock { state -> Int in
            defer { state.nextID += 1 }
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let answer = state.withLock { state -> Bool? in
                    if state.isOpen { return true }
                    if Task.isCancelled { return false }
                    state.waiters[id] = continuation
                    return nil
                }
                if let answer { continuation.resume(returning: answer) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(returning: false)
        }
    }

    /// Waits `duration`, or less when the latch opens first. True when it opened.
    @discardableResult
    public func wait(atMost duration: Duration) async -> Bool {
        if isOpen { return true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.wait() }
            group.addTask {
                try? await Task.sleep(for: duration)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first || isOpen
        }
    }
}
