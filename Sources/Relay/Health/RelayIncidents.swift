/// What has gone wrong with the relay's dependencies so far (``RelayPipeline/incidents``).
public struct RelayIncidents: Sendable, Equatable {
    /// Why Redis is failing, while it is (nil once a call succeeds again).
    public var redisTrouble: String?
    /// The trouble is the mailbox poll's (its due-index read failed): its next full read
    /// clears it. Another call's trouble only that call's success clears (a Redis that reads
    /// but cannot write must not flap between failing and answering with every poll).
    var redisTroubleIsThePolls = false
    /// Times Redis started failing (each outage counted once, when it begins).
    public var redisOutages = 0
    /// Outcome and invalidation record deliveries Kafka has failed so far (each is tried
    /// again until it is delivered).
    public var publishFailures = 0

    public init() {}
}
