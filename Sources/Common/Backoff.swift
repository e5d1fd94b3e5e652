/// Exponential backoff with jitter: attempt n waits a random time in [base·2ⁿ / 2, base·2ⁿ],
/// capped at `maximum` (without jitter, exactly base·2ⁿ: for tests).
public struct Backoff: Sendable, Equatable {
    public var base: Duration
    public var maximum: Duration
    public var jitter: Bool

    public init(base: Duration = .milliseconds(500), maximum: Duration = .seconds(30), jitter: Bool = true) {
        self.base = base
        self.maximum = maximum
        self.jitter = jitter
    }

    /// The wait before retry number `attempt` (0 for the first retry).
    public func delay(attempt: Int) -> Duration {
        let ceiling = min(base * (1 << min(max(attempt, 0), 30)), maximum)
        guard jitter else { return ceiling }
        let nanoseconds = ceiling.totalNanoseconds
        let jittered = Int64.random(in: (nanoseconds / 2)...max(nanoseconds, 1))
        return .nanoseconds(jittered)
    }
}
