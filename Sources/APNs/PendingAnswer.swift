import HTTP2
import Common

/// Where one request's answer goes: resumed exactly once, by the answer or by the waiting task's
/// cancellation, whichever comes first (a late answer is dropped).
final class PendingAnswer: Sendable {
    typealias Answer = Result<HTTP2Response, HTTP2StreamError>

    /// What a cancelled wait answers.
    static let cancelled = Answer.failure(.connectionLost("the waiting task was cancelled"))

    private enum State {
        case new
        case waiting(UnsafeContinuation<Answer, Never>)
        case done
    }

    private let state = Locked(State.new)

    /// Hands over the continuation to resume. False when the task was cancelled first: the
    /// continuation is resumed with ``cancelled`` here and nothing is to be sent.
    func install(_ continuation: UnsafeContinuation<Answer, Never>) -> Bool {
        let installed = state.withLock { state -> Bool in
            guard case .new = state else { return false }
            state = .waiting(continuation)
            return true
        }
        if !installed { continuation.resume(returning: Self.cancelled) }
        return installed
    }

    func resume(_ answer: Answer) {
        let waiting = state.withLock { state -> UnsafeContinuation<Answer, Never>? in
            defer { state = .done }
            if case .waiting(let continuation) = state { return continuation }
            return nil
        }
        waiting?.resume(returning: answer)
    }

    func cancel() {
        resume(Self.cancelled)
    }

    /// Answered or cancelled already.
    var isDone: Bool {
        state.withLock { state in
            if case .done = state { return true }
            return false
        }
    }
}
