import Synchronization

/// Lets one task at a time through a section, the others in the order they came (an async
/// lock). A task cancelled while it waits stops waiting and does not run the section.
public final class AsyncSerialGate: Sendable {
    private struct State {
        var busy = false
        var nextID = 0
        /// Waiting tasks by id, in arrival order.
        var queue: [(id: Int, continuation: CheckedContinuation<Bool, Never>)] = []
    }

    private let state = Locked(State())

    public init() {}

    /// Runs `body` once no other task is in it; nil when the task was cancelled while it waited.
    public func run<T: Sendable>(_ body: () async -> T) async -> T? {
        guard await enter() else { return nil }
        let result = await body()
        leave()
        return result
    }

    private func enter() async -> Bool {
        let id = state.withLock { state -> Int? in
            guard state.busy else {
                state.busy = true
                return nil
            }
            defer { state.nextID += 1 }
            return state.nextID
        }
        guard let id else { return true }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                // Busy is asked again where the waiter queues, under the same lock: the one inside
                // may have left since, finding nobody queued, and nobody would let this one in.
                let now = state.withLock { state -> Bool? in
                    if Task.isCancelled { return false }
                    guard state.busy else {
                        state.busy = true
                        return true
                    }
                    state.queue.append((id, continuation))
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                guard let index = state.queue.firstIndex(where: { $0.id == id }) else { return nil }
                return state.queue.remove(at: index).continuation
            }
            waiter?.resume(returning: false)
        }
    }

    /// Hands the gate to the next waiting task, or opens it.
    private func leave() {
        let next = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard !state.queue.isEmpty else {
                state.busy = false
                return nil
            }
            return state.queue.removeFirst().continuation
        }
        next?.resume(returning: true)
    }
}
