import APNs
import Foundation
import Kafka
import Metrics
import Redis
import Common

/// The metrics the relay emits; names live here only (docs/operations.md and dashboards read
/// them from here).
enum RelayMetrics {
    /// Per lane (label `lane`: its intents topic): `apns_relay_intents_consumed_total`,
    /// `apns_relay_in_flight` (between consume and outcome, the intents waiting behind their device
    /// included) and `apns_relay_intent_duration_seconds` (consume → outcome decided; from a mailbox,
    /// the time since its intent was first consumed).
    struct Lane: Sendable {
        let consumed: Counter
        let inFlight: Gauge
        let latency: Timer

        /// The lane's series, made to exist from the start (at 0).
        init(topic: String) {
            consumed = Counter(label: "apns_relay_intents_consumed_total", dimensions: [("lane", topic)])
            inFlight = Gauge(label: "apns_relay_in_flight", dimensions: [("lane", topic)])
            latency = Timer(label: "apns_relay_intent_duration_seconds", dimensions: [("lane", topic)], preferredDisplayUnit: .seconds)
            consumed.increment(by: 0)
            inFlight.record(0)
        }
    }

    static let retries = Counter(label: "apns_relay_retries_total")
    /// `apns_relay_redis_errors_total{kind}`: `outage` (no answer — connection refused or lost, timed
    /// out — or an answer saying Redis itself is in trouble: `LOADING`, `OOM`, `READONLY`, …) or
    /// `refused` (an error for what a key holds, `WRONGTYPE`, a script's `ERR`: asking again
    /// gives the same). Only an outage means Redis is down; the alert reads that kind.
    static let redisOutage = Counter(label: "apns_relay_redis_errors_total", dimensions: [("kind", "outage")])
    static let redisRefused = Counter(label: "apns_relay_redis_errors_total", dimensions: [("kind", "refused")])

    static func redisError(_ error: RedisError) {
        (error.isRefusal ? redisRefused : redisOutage).increment()
    }
    /// Intents parked in their device's mailbox (rate limit, 429 backoff, APNs unavailable).
    static let parked = Counter(label: "apns_relay_parked_total")
    /// Partitions paused because too many of their offsets wait behind an unfinished one.
    static let partitionsHeld = Gauge(label: "apns_relay_partitions_held")
    /// Outcomes (and invalidation records) whose publishing failed once (each is retried until
    /// it succeeds).
    static let publishFailures = Counter(label: "apns_relay_outcome_publish_failures_total")
    /// `apns_relay_invalidations_published_total{kind}`: records on `kafka.invalidations_topic`,
    /// `unregistered` (a pair is dead) or `tombstone` (delivered to: alive).
    static let invalidationsPublished = Counter(label: "apns_relay_invalidations_published_total", dimensions: [("kind", "unregistered")])
    static let tombstonesPublished = Counter(label: "apns_relay_invalidations_published_total", dimensions: [("kind", "tombstone")])
    /// Revocations whose commit the group coordinator refused: the partitions' next owners
    /// send again what was finished here since the last commit.
    static let revocationCommitFailures = Counter(label: "apns_relay_revocation_commit_failures_total")
    /// Intents queued behind an intent of their device consumed from another partition number
    /// (``DeviceQueues/acrossPartitions``), counted once a second: their producer does not key
    /// intents by device, or the lanes' topics have different partition counts.
    static let intentsAcrossPartitions = Counter(label: "apns_relay_intents_across_partitions_total")
    /// Round trips to Redis the pipeline waited for (admissions, records, mailboxes).
    static let redisLatency = Timer(label: "apns_relay_redis_request_duration_seconds", preferredDisplayUnit: .seconds)
    static let apnsLatency = Timer(label: "apns_relay_apns_request_duration_seconds", preferredDisplayUnit: .seconds)

    /// `apns_relay_outcomes_total{topic,status,reason}`: outcomes by app, status and reason code (the
    /// part before any ":" detail). `topic` is the intent's topic when a credential covers it
    /// (the configured bundle ids and their push-type suffixes), else `other`: intents name any
    /// topic they like, the label set stays the configured one. Reasons partly come from outside
    /// (APNs may answer a reason this version does not know), so at most `maxReasonLabels`
    /// distinct codes get their own label; later new ones count as `other`.
    static func outcome(_ outcome: Outcome, topic: String) {
        counters.counter("apns_relay_outcomes_total", ("apns_topic", topic), ("status", outcome.status.rawValue),
                         ("reason", outcome.reason.map(reasonLabel) ?? "none")).increment()
    }

    /// The counters counted per event (an outcome, a policy decision, a Live Activity push).
    static let counters = LabelledCounters()

    /// Counters with labels, each made once per label set: one made per event was looked up in
    /// the metrics backend's registry every time (its labels joined and hashed under its lock).
    /// Bounded as the label values its callers pass are (configured topics and `other`, fixed
    /// sets of statuses, decisions, modes and budgets, at most ``maxReasonLabels`` reasons).
    final class LabelledCounters: Sendable {
        /// A counter's name and its labels' values (up to three: each name always comes with the
        /// same label names, in the same order).
        private struct Key: Hashable {
            let label: String
            let first: String
            let second: String
            let third: String
        }

        private let made = Locked<[Key: Counter]>([:])

        func counter(_ label: String, _ first: (String, String), _ second: (String, String)? = nil,
                     _ third: (String, String)? = nil) -> Counter {
            let key = Key(label: label, first: first.1, second: second?.1 ?? "", third: third?.1 ?? "")
            if let counter = made.withLock({ $0[key] }) { return counter }
            let counter = Counter(label: label, dimensions: [first] + [second, third].compactMap { $0 })
            return made.withLock { made in
                if let existing = made[key] { return existing }
                made[key] = counter
                return counter
            }
        }
    }

    /// The `reason` label for an outcome's reason.
    static func reasonLabel(_ reason: String?) -> String {
        reasonLabels.label(reason)
    }

    static let maxReasonLabels = 100
    private static let reasonLabels = ReasonLabels(limit: maxReasonLabels)

    /// At most `limit` distinct reason codes get a label of their own; later new ones are `other`.
    final class ReasonLabels: Sendable {
        let limit: Int
        private let seen = Locked(Set<String>())

        init(limit: Int) {
            self.limit = limit
        }

        /// The label for `reason`: its code (the part before any ":"), `none` for no reason.
        func label(_ reason: String?) -> String {
            let code = reason.map { String($0.prefix { $0 != ":" }) } ?? "none"
            return seen.withLock { labels -> String in
                if labels.contains(code) { return code }
                guard labels.count < limit else { return "other" }
                labels.insert(code)
                return code
            }
        }
    }

    /// Partitions whose lag this process shows.
    private static let lagPartitions = Locked(Set<TopicPartition>())

    /// `apns_relay_consumer_lag{lane,partition}` for the partitions this relay owns now (`owned`: its
    /// assignment; `lag` may miss one whose position is not known yet); the series of a
    /// partition it no longer owns is removed (after a rebalance its new owner reports it, and a
    /// sum over the fleet counts it once).
    static func consumerLag(_ lag: [TopicPartition: Int64], owned: Set<TopicPartition>) {
        func gauge(_ partition: TopicPartition) -> Gauge {
            Gauge(label: "apns_relay_consumer_lag", dimensions: [("lane", partition.topic), ("partition", String(partition.partition))])
        }
        for (partition, records) in lag where owned.contains(partition) {
            gauge(partition).record(records)
        }
        let gone = lagPartitions.withLock { shown in
            defer { shown = owned }
            return shown.subtracting(owned)
        }
        for partition in gone { gauge(partition).destroy() }
    }

    /// librdkafka's statistics of the producer or the consumer (`client`) as gauges:
    /// `apns_relay_kafka_broker_up` and `apns_relay_kafka_broker_rtt_seconds` per broker, the producer's
    /// `apns_relay_kafka_producer_queue_messages` and `apns_relay_kafka_producer_queue_latency_seconds`
    /// (per broker), the consumer's `apns_relay_kafka_consumer_fetching` per assigned partition.
    /// Series of brokers and partitions no longer listed (a partition revoked) go.
    static func kafkaStatistics(_ statistics: KafkaStatistics, client: String) {
        let brokers = Set(statistics.brokers.map(\.name))
        for broker in statistics.brokers {
            Gauge(label: "apns_relay_kafka_broker_up", dimensions: [("client", client), ("broker", broker.name)]).record(broker.isUp ? 1 : 0)
            Gauge(label: "apns_relay_kafka_broker_rtt_seconds", dimensions: [("client", client), ("broker", broker.name)])
                .record(broker.roundTripSeconds)
            if client == "producer" {
                Gauge(label: "apns_relay_kafka_producer_queue_latency_seconds", dimensions: [("broker", broker.name)]).record(broker.queueLatencySeconds)
            }
        }
        let partitions = Set(statistics.partitions.map { "\($0.topic)\u{0}\($0.partition)" })
        if client == "producer" {
            Gauge(label: "apns_relay_kafka_producer_queue_messages").record(statistics.queuedMessages)
        } else {
            for partition in statistics.partitions {
                Gauge(label: "apns_relay_kafka_consumer_fetching", dimensions: [("lane", partition.topic), ("partition", String(partition.partition))])
                    .record(partition.fetchState == "active" ? 1 : 0)
            }
        }
        let (goneBrokers, gonePartitions) = kafkaSeries.withLock { shown in
            defer {
                shown.brokers[client] = brokers
                if client == "consumer" { shown.partitions = partitions }
            }
            return ((shown.brokers[client] ?? []).subtracting(brokers), client == "consumer" ? shown.partitions.subtracting(partitions) : [])
        }
        for broker in goneBrokers {
            Gauge(label: "apns_relay_kafka_broker_up", dimensions: [("client", client), ("broker", broker)]).destroy()
            Gauge(label: "apns_relay_kafka_broker_rtt_seconds", dimensions: [("client", client), ("broker", broker)]).destroy()
            if client == "producer" { Gauge(label: "apns_relay_kafka_producer_queue_latency_seconds", dimensions: [("broker", broker)]).destroy() }
        }
        for key in gonePartitions {
            let parts = key.split(separator: "\u{0}", maxSplits: 1)
            guard parts.count == 2 else { continue }
            Gauge(label: "apns_relay_kafka_consumer_fetching", dimensions: [("lane", String(parts[0])), ("partition", String(parts[1]))]).destroy()
        }
    }

    private static let kafkaSeries = Locked<(brokers: [String: Set<String>], partitions: Set<String>)>(([:], []))

    /// `apns_relay_policy_decisions_total{apns_topic,decision,mode}`: what the policy decided
    /// for each intent (``RelayPipeline/policyDecision(_:)``), in enforce mode and in shadow
    /// mode alike, so a dashboard compares what a shadowed topic would hold back.
    static func policyDecision(topic: String, decision: String, mode: String) {
        counters.counter("apns_relay_policy_decisions_total", ("apns_topic", topic), ("decision", decision), ("mode", mode)).increment()
    }

    /// `apns_relay_mailbox_entries_quarantined_total`: mailbox entries no relay could read (a
    /// claimed one, or a displaced one handed over), moved aside (their intents get no outcome).
    static let mailboxEntriesQuarantined = Counter(label: "apns_relay_mailbox_entries_quarantined_total")

    /// `apns_relay_live_activity_downgrades_total{apns_topic}`: priority-10 Live Activity updates
    /// past their activity's budget, sent at priority 5.
    static func liveActivityDowngrades(topic: String, by count: Int64 = 1) {
        counters.counter("apns_relay_live_activity_downgrades_total", ("apns_topic", topic)).increment(by: count)
    }

    /// `apns_relay_live_activity_starts_deferred_total{apns_topic}`: push-to-starts past their
    /// token's window, parked in the mailbox until it allows.
    static func liveActivityStartsDeferred(topic: String, by count: Int64 = 1) {
        counters.counter("apns_relay_live_activity_starts_deferred_total", ("apns_topic", topic)).increment(by: count)
    }

    /// `apns_relay_live_activity_budget_spent_total{apns_topic,budget}`: pushes that spent a
    /// Live Activity budget (`budget` `priority10` for a priority-10 update or end, `start` for
    /// a push-to-start), in either policy mode: set against the budget, how much of it an app uses.
    static func liveActivityBudgetSpent(topic: String, budget: String, by count: Int64 = 1) {
        counters.counter("apns_relay_live_activity_budget_spent_total", ("apns_topic", topic), ("budget", budget)).increment(by: count)
    }

    /// Makes the series a dashboard or alert reads exist from the start (at 0), rather than
    /// appearing with the first event: the counters, the held partitions, the Live Activity
    /// budget counters of each app, every status of `apns_relay_outcomes_total` for each
    /// configured bundle id, and each configured team's credential faults.
    static func register(teamIDs: [String], topics: [String]) {
        for counter in [retries, redisOutage, redisRefused, parked, publishFailures, invalidationsPublished, tombstonesPublished,
                        mailboxEntriesQuarantined, revocationCommitFailures, intentsAcrossPartitions] { counter.increment(by: 0) }
        partitionsHeld.record(0)
        for topic in Set(topics) {
            // The app's Live Activity topic, as its pushes are labelled (a bundle id, or one
            // named with that suffix; not another push type's topic).
            let suffix = PushType.liveactivity.topicSuffix
            if topic.hasSuffix(suffix) || !PushType.allCases.contains(where: { !$0.topicSuffix.isEmpty && topic.hasSuffix($0.topicSuffix) }) {
                let live = topic.hasSuffix(suffix) ? topic : topic + suffix
                liveActivityDowngrades(topic: live, by: 0)
                liveActivityStartsDeferred(topic: live, by: 0)
                for budget in LiveActivityPacer.Budget.allCases { liveActivityBudgetSpent(topic: live, budget: budget.name, by: 0) }
            }
            for status in Outcome.Status.allCases {
                Counter(label: "apns_relay_outcomes_total", dimensions: [("apns_topic", topic), ("status", status.rawValue), ("reason", "none")])
                    .increment(by: 0)
            }
        }
        for teamID in Set(teamIDs) {
            Counter(label: "apns_relay_credential_faults_total", dimensions: [("team_id", teamID)]).increment(by: 0)
        }
    }

    /// `apns_relay_certificate_expiry_timestamp_seconds{subject}`: when each certificate credential's
    /// certificate expires (epoch seconds), set as a relay starts with them; the series of a
    /// subject no longer configured (a reload removed or replaced it) go.
    static func certificateExpiries(_ certificates: [APNsCertificateInfo]) {
        func gauge(_ subject: String) -> Gauge {
            Gauge(label: "apns_relay_certificate_expiry_timestamp_seconds", dimensions: [("subject", subject)])
        }
        let subjects = Set(certificates.map(\.subject))
        let gone = certificateSubjects.withLock { shown in
            defer { shown = subjects }
            return shown.subtracting(subjects)
        }
        for subject in gone { gauge(subject).destroy() }
        for certificate in certificates { gauge(certificate.subject).record(certificate.notValidAfter.timeIntervalSince1970.rounded(.down)) }
    }

    private static let certificateSubjects = Locked(Set<String>())

    static func credentialFault(teamID: String) {
        Counter(label: "apns_relay_credential_faults_total", dimensions: [("team_id", teamID)]).increment()
    }
}
