import Synchronization

/// A value that tasks can wait on: ``update(_:)`` changes it under a lock, and every waiter
/// whose condition now holds goes on.
///
/// For states that change now and then and that somebody waits for (a dependency failing or
/// answering again, a count reaching a mark): every update checks the conditions waiting, so
/// it is not for a value that many tasks wait on while it changes thousands of times a second.
/// With nobody waiting an update costs one uncontended lock.
public final class AsyncWatched<Value: Sendable>: Sendable {
    private struct Waiter {
        var condition: @Sendable (Value) -> Bool
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var value: Value
        var nextID = 0
        var waiters: [Int: Waiter] = [:]
    }

    private let state: Locked<State>

    public init(_ value: Value) {
        state = Locked(State(value: value))
    }

    /// The value now.
    public var value: Value { state.withLock { $0.value } }

    /// Changes the value; the waiters whose condition holds afterwards go on.
    @discardableResult
    public func update<Result: Sendable>(_ change: (inout Value) -> Result) -> Result {
        let (result, ready) = state.withLock { state -> (Result, [CheckedContinuation<Bool, Never>]) in
            let result = change(&state.value)
            guard !state.waiters.isEmpty else { return (result, []) }
            let value = state.value
            let ids = state.waiters.compactMap { $0.value.condition(value) ? $0.key : nil }
            return (result, ids.compactMap { state.waiters.removeValue(forKey: $0)?.continuation })
        }
        for continuation in ready { continuation.resume(returning: true) }
        return result
    }

    /// Waits until `condition` holds for the value (true: at once when it holds already), or
    /// until `timeout` passed or the task is cancelled (false).
    public func wait(atMost timeout: Duration, until condition: @escaping @Sendable (Value) -> Bool) async -> Bool {
        if condition(value) { return true }
        let id = state.withLock { state -> Int in
            defer { state.nextID += 1 }
            return state.nextID
        }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.wait(id: id, until: condition) }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            // A change at the deadline's moment still counts.
            return first || condition(value)
        }
    }

    private func wait(id: Int, until condition: @escaping @Sendable (Value) -> Bool) async -> Bool {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let answer = state.withLock { state -> Bool? in
                    if condition(state.value) { return true }
                    if Task.isCancelled { return false }
                    state.waiters[id] = Waiter(condition: condition, continuation: continuation)
                    return nil
                }
                if let answer { continuation.resume(returning: answer) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.continuation.resume(returning: false)
        }
    }
}
