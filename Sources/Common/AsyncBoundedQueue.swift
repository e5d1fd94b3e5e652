import NIOCore
import Synchronization

/// A bounded first-in-first-out hand-over between one producing task and one consuming task:
/// `push` waits while `capacity` elements wait, `pop` waits while none does. Both give up when
/// their task is cancelled or the queue is finished (`push` then answers false, `pop` nil once
/// the queue is empty).
final class HandOver<Element: Sendable>: Sendable {
    private struct State {
        var items = CircularBuffer<Element>()
        var popper: CheckedContinuation<Element?, Never>?
        var pusher: CheckedContinuation<Bool, Never>?
        var finished = false
    }

    private let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = max(capacity, 1)
    }

    /// Adds `element`, waiting for room first. False when the queue was finished or the task
    /// cancelled (the element is dropped).
    func push(_ element: Element) async -> Bool {
        let room = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let answer = state.withLock { state -> Bool? in
                    if state.finished || Task.isCancelled { return false }
                    if state.items.count < capacity { return true }
                    state.pusher = continuation
                    return nil
                }
                if let answer { continuation.resume(returning: answer) }
            }
        } onCancel: {
            take(\.pusher)?.resume(returning: false)
        }
        guard room else { return false }
        let popper = state.withLock { state -> CheckedContinuation<Element?, Never>? in
            if let popper = state.popper {
                state.popper = nil
                return popper
            }
            state.items.append(element)
            return nil
        }
        popper?.resume(returning: element)
        return true
    }

    /// The next element; nil when the queue is finished and empty, or the task cancelled.
    func pop() async -> Element? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Element?, Never>) in
                let (ready, pusher) = state.withLock { state -> (Element??, CheckedContinuation<Bool, Never>?) in
                    if Task.isCancelled { return (.some(nil), nil) }
                    if let first = state.items.popFirst() {
                        defer { state.pusher = nil }
                        return (.some(first), state.pusher)
                    }
                    if state.finished { return (.some(nil), nil) }
                    state.popper = continuation
                    return (nil, nil)
                }
                pusher?.resume(returning: true)
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            take(\.popper)?.resume(returning: nil)
        }
    }

    /// Takes a waiting task's continuation out of the state (to resume it outside the lock).
    private func take<Waiter: Sendable>(_ waiter: WritableKeyPath<State, Waiter?>) -> Waiter? {
        state.withLock { state in
            defer { state[keyPath: waiter] = nil }
            return state[keyPath: waiter]
        }
    }

    /// No more elements: a waiting `pop` gets nil once the queue is empty, a waiting `push` false.
    func finish() {
        let (popper, pusher) = state.withLock { state in
            state.finished = true
            defer { state.pusher = nil }
            let popper = state.items.isEmpty ? state.popper : nil
            if popper != nil { state.popper = nil }
            return (popper, state.pusher)
        }
        popper?.resume(returning: nil)
        pusher?.resume(returning: false)
    }
}
