/// What a retry loop does after a failed attempt.
public enum RetryDecision: Sendable {
    case retry
    case giveUp
}

/// The one retry loop the relay's retries share: attempts until one succeeds, with a backoff
/// (exponential, with jitter) between them; the caller decides after each failure whether to go
/// on. A cancelled task gives up, and so does a caller that is stopping (``interrupt`` opened).
public struct Retry: Sendable {
    public var backoff: Backoff
    /// When it opens, a wait between attempts ends and the loop gives up.
    public var interrupt: AsyncLatch?

    public init(backoff: Backoff, interrupt: AsyncLatch? = nil) {
        self.backoff = backoff
        self.interrupt = interrupt
    }

    /// Runs `attempt` until it succeeds (its result) or gives up (nil).
    ///
    /// - Parameters:
    ///   - attempt: one try.
    ///   - failed: hears each failure, with how many there were so far (1 for the first), and
    ///     says whether to try again.
    @inlinable
    public func run<T, Failure: Error>(_ attempt: () async throws(Failure) -> T,
                                       failed: (Failure, Int) -> RetryDecision) async -> T? {
        var failures = 0
        while true {
            do {
                return try await attempt()
            } catch {
                failures += 1
                guard case .retry = failed(error, failures), !Task.isCancelled, interrupt?.isOpen != true else { return nil }
                let delay = backoff.delay(attempt: failures - 1)
                if let interrupt {
                    if await interrupt.wait(atMost: delay) { return nil }
                } else {
                    try? await Task.sleep(for: delay)
                }
            }
        }
    }
}
