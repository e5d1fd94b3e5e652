/// What has gone wrong with the relay's dependencies so far (``RelayPipeline/incidents``).
public struct RelayIncidents: Sendable, Equatable {
    /// Why Redis is failing, while it is: nil once every kind of call that failed succeeds again.
    public var redisTrouble: String? { redisTroubles[.calls] ?? redisTroubles[.mailboxes] ?? redisTroubles[.poll] }
    /// The last failure of each kind of call still failing. Each kind's success clears only its
    /// own: the poll's due-index reads can succeed while writes fail (a Redis that reads but
    /// cannot write must not flap between failing and answering with every poll), and the poll
    /// may be the only call while no intent comes (its failure must not stay for good).
    var redisTroubles: [RedisCaller: String] = [:]
    /// Times Redis started failing (each outage counted once, when it begins).
    public var redisOutages = 0
    /// Outcome and invalidation record deliveries Kafka has failed so far (each is tried
    /// again until it is delivered).
    public var publishFailures = 0
    /// Why the relay refused to go on (its Redis can evict parked intents, ``RedisGuarantees``);
    /// set once.
    public var refusal: String?
    /// Redis' risks to parked intents as last read (each change is logged once).
    public var redisRisks: [String] = []

    public init() {}
}

/// Who met a Redis failure (``RelayIncidents/redisTroubles``).
enum RedisCaller: Hashable, Sendable {
    /// Admission, parks and records: cleared by their next success.
    case calls
    /// The mailbox poll's due-index reads: cleared by a poll that read every index.
    case poll
    /// Mailbox takes, releases, hand-overs: cleared by a take that succeeds.
    case mailboxes
}
