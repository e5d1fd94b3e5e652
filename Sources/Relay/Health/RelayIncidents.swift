/// What has gone wrong with the relay's dependencies so far (``RelayPipeline/incidents``).
public struct RelayIncidents: Sendable, Equatable {
    /// Why Redis is failing, while it is (nil once a call succeeds again).
    public var redisTrouble: String?
    /// Times Redis started failing (each outage counted once, when it begins).
    public var redisOutages = 0
    /// Outcome and invalidation record deliveries Kafka has failed so far (each is tried
    /// again until it is delivered).
    public var publishFailures = 0

    public init() {}
}
