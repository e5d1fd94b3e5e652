import Common
import Logging
import Redis

/// The relay's incidents as they happen, and the one owner of them: Redis failing (by kind of
/// call) and its risks to parked intents, outcome deliveries failing, a refusal to run, and
/// since when the consumer has reached no Kafka broker. The pipeline reports to it; `/healthz`,
/// `/readyz` and the pipeline's public accessors read it, and whoever needs to see an incident
/// begin or end waits on ``incidents``.
final class RelayHealth: Sendable {
    /// Redis failing and outcome deliveries failing, as they happen.
    let incidents = AsyncWatched(RelayIncidents())
    /// Since when the consumer has had no broker connection up (librdkafka's statistics); nil
    /// while one is.
    private let kafkaUnreachableSince = Locked<ContinuousClock.Instant?>(nil)
    private let logger: Logger
    /// `redis.fail_open`: what the relay does while Redis fails, which its log and problems say.
    private let failOpen: Bool
    /// `kafka.unready_after_unreachable_seconds`.
    private let unreadyAfterUnreachable: Duration

    init(logger: Logger, failOpen: Bool, unreadyAfterUnreachableSeconds: Int) {
        self.logger = logger
        self.failOpen = failOpen
        self.unreadyAfterUnreachable = .seconds(unreadyAfterUnreachableSeconds)
    }

    // Redis.

    /// A Redis call failed (``RelayIncidents/redisTroubles``): the first failure while Redis
    /// answered starts an outage (counted, logged once).
    func redisFailed(_ error: RedisError, by caller: RedisCaller = .calls) {
        let isNew = incidents.update { incidents in
            let wasFine = incidents.redisTrouble == nil
            incidents.redisTroubles[caller] = "\(error)"
            if wasFine { incidents.redisOutages += 1 }
            return wasFine
        }
        RelayMetrics.redisError(error)
        if isNew {
            logger.error("Redis is failing", metadata: ["redis.error": "\(error)", "redis.fail_open": "\(failOpen)"])
        }
    }

    /// A kind of Redis call succeeded: its trouble is over, and the outage once none is left.
    func redisRecovered(by caller: RedisCaller = .calls) {
        let over = incidents.update { incidents in
            guard incidents.redisTroubles.removeValue(forKey: caller) != nil else { return false }
            return incidents.redisTrouble == nil
        }
        if over { logger.warning("Redis answers again") }
    }

    /// Whether admissions, parks and records are failing now (the mailbox poll's troubles aside).
    var redisCallsFailing: Bool { incidents.value.redisTroubles[.calls] != nil }

    /// Redis' risks to parked intents as read now: each change logged once.
    func redisRisks(_ warnings: [String]) {
        let changed = incidents.update { incidents in
            defer { incidents.redisRisks = warnings }
            return incidents.redisRisks != warnings
        }
        if changed { for warning in warnings { logger.warning("\(warning)") } }
    }

    /// The relay refuses to go on (``RelayIncidents/refusal``, kept from the first).
    func refuse(_ risk: String) {
        let first = incidents.update { incidents in
            defer { incidents.refusal = incidents.refusal ?? risk }
            return incidents.refusal == nil
        }
        if first { logger.critical("refusing to run: \(risk)") }
    }

    // Kafka.

    /// An outcome or invalidation record's delivery failed (it is tried again).
    func publishFailed() {
        incidents.update { $0.publishFailures += 1 }
    }

    /// Whether the consumer has a broker connection up, as its statistics last said (`brokers`:
    /// each broker's name and state): the first report without one starts the time
    /// ``kafkaNotReadyReason`` counts (logged once).
    func consumerReaches(_ reachable: Bool, brokers: @autoclosure () -> [String]) {
        let started = kafkaUnreachableSince.withLock { since -> Bool in
            defer { since = reachable ? nil : since ?? .now }
            return since == nil && !reachable
        }
        if started { logger.warning("no Kafka broker reachable", metadata: ["kafka.brokers": "\(brokers())"]) }
    }

    /// Why the relay is not ready for Kafka's sake: no broker reachable for
    /// `kafka.unready_after_unreachable_seconds`.
    var kafkaNotReadyReason: String? {
        guard let since = kafkaUnreachableSince.withLock({ $0 }) else { return nil }
        let unreachable = ContinuousClock.now - since
        return unreachable >= unreadyAfterUnreachable ? "no Kafka broker reachable for \(unreachable.components.seconds) s" : nil
    }

    /// Redis' line of `/readyz?verbose`, while it fails.
    var redisProblem: String? {
        incidents.value.redisTrouble.map {
            failOpen ? "Redis unreachable (sending without policy): \($0)" : "Redis unreachable (not consuming): \($0)"
        }
    }
}
