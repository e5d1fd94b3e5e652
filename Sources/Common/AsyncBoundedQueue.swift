import NIOCore
import Synchronization

/// The one bounded first-in-first-out queue between a producer and one consuming task.
///
/// Its size is the sum of its elements' weights (1 each unless told otherwise: the Kafka
/// consumer weighs a batch by its records). ``push(_:)`` waits while the queue holds `capacity`
/// or more; a producer that cannot wait (a C library's thread) uses ``offer(_:)``, which never
/// waits, and does its own flow control from the size it answers. ``pop()`` waits while the
/// queue is empty. Both give up when their task is cancelled or the queue is finished (`push`
/// then answers false, `pop` nil once the queue is empty).
public final class AsyncBoundedQueue<Element: Sendable>: Sendable {
    private struct State {
        var items = CircularBuffer<Element>()
        var size = 0
        var popper: CheckedContinuation<Element?, Never>?
        var pusher: CheckedContinuation<Bool, Never>?
        var finished = false
    }

    public let capacity: Int
    private let weight: (@Sendable (Element) -> Int)?
    private let state = Locked(State())

    /// - Parameter weight: an element's share of `capacity` (nil: 1 each).
    public init(capacity: Int, weight: (@Sendable (Element) -> Int)? = nil) {
        self.capacity = max(capacity, 1)
        self.weight = weight
    }

    private func weight(of element: Element) -> Int { weight?(element) ?? 1 }

    /// The sum of the waiting elements' weights.
    public var size: Int { state.withLock { $0.size } }

    public var isFinished: Bool { state.withLock { $0.finished } }

    /// Adds `element`, waiting for room first. False when the queue was finished or the task
    /// cancelled (the element is dropped).
    public func push(_ element: Element) async -> Bool {
        let room = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let answer = state.withLock { state -> Bool? in
                    if state.finished || Task.isCancelled { return false }
                    if state.size < capacity { return true }
                    state.pusher = continuation
                    return nil
                }
                if let answer { continuation.resume(returning: answer) }
            }
        } onCancel: {
            take(\.pusher)?.resume(returning: false)
        }
        guard room else { return false }
        return offer(element) != nil
    }

    /// Adds `element` without waiting, whatever the size. The size after it, or nil when the
    /// queue is finished (the element is dropped).
    @discardableResult
    public func offer(_ element: Element) -> Int? {
        let weight = weight(of: element)
        let (popper, size) = state.withLock { state -> (CheckedContinuation<Element?, Never>?, Int?) in
            if state.finished { return (nil, nil) }
            if let popper = state.popper {
                state.popper = nil
                return (popper, state.size)
            }
            state.items.append(element)
            state.size += weight
            return (nil, state.size)
        }
        popper?.resume(returning: element)
        return size
    }

    /// The next element; nil when the queue is finished and empty, or the task cancelled.
    public func pop() async -> Element? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Element?, Never>) in
                let (ready, pusher) = state.withLock { state -> (Element??, CheckedContinuation<Bool, Never>?) in
                    if Task.isCancelled { return (.some(nil), nil) }
                    if let first = state.items.popFirst() {
                        state.size -= weight(of: first)
                        guard state.size < capacity, let pusher = state.pusher else { return (.some(first), nil) }
                        state.pusher = nil
                        return (.some(first), pusher)
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
    public func finish() {
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
