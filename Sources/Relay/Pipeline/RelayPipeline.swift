public import Common
import APNs
import Foundation
import Kafka
import Logging
import NIOCore
import NIOPosix
import Redis
public import ServiceLifecycle
import Synchronization
import Tracing

/// The relay's main job: intents from Kafka, notifications to APNs, one outcome per intent back
/// to Kafka, offsets committed only behind delivered outcomes (at-least-once).
///
/// - Every consumed message is answered: unusable ones with `invalid` at once (a poison message
///   never blocks its partition), the rest after APNs answered, retries included.
/// - Intents for one device token go out one after another, in offset order.
/// - Retryable answers are retried with exponential backoff and jitter until the intent's
///   expiration or the retry deadline; expiration 0 means one attempt.
/// - A credential fault stops sends for that team only, for a cool-down, then one intent probes.
/// - At most `limits.maxInFlight` intents are under way between consume and outcome, and at
///   most `limits.maxWaiting` wait behind an earlier intent for their device (they take no
///   send slot, so one busy device does not stall the others); past that the loop
///   stops reading, the consumer's bounded buffer fills and it pauses its partitions.
/// - An offset becomes committable once its outcome's delivery report succeeded and every
///   earlier offset of the partition is done. Work for revoked partitions is dropped unsent
///   where it has not reached APNs, and its offsets are never stored.
public final class RelayPipeline: RelayStatus, Service {
    /// What the policy decided for a consumed intent (``BatchAdmission/Admission``).
    typealias Admission = BatchAdmission.Admission

    public let configuration: RelayConfiguration
    public let worker: String
    let consumer: KafkaConsumer
    /// The relay's producer: outcomes go through ``outcomes``; invalidations, the flush and the
    /// purge at the end of a run, and liveness (its fatal error) use it here.
    let producer: KafkaProducer
    let credentials: CredentialDirectory
    /// Per credential, whom its faults are counted for (``LoadedCredential/team``), and what
    /// its certificate says (nil for a token): MDM pushes need one, an intent's environment
    /// must be one it allows, and it must be valid when a send is due.
    let credentialTeams: [String]
    let certificates: [APNsCertificateInfo?]
    /// APNs clients by credential and endpoint, opened on first use.
    let clients: APNsClientRegistry
    let endpoints: [APNsEnvironment: Result<APNsEndpoint, APNsError>]
    /// Each lane's intents topic (`kafka.lanes`, or `kafka.intents_topic` alone): a work item's
    /// ``WorkItem/lane`` indexes these.
    let laneTopics: [String]
    /// Each lane's precedence among sends waiting for an APNs stream: its weight's rank among
    /// the lanes' distinct weights (0 for the lowest), 3 at most. With one weight, all 0.
    let lanePrecedence: [Int]
    let laneMetrics: [RelayMetrics.Lane]
    /// The partitions paused (held by the ledger), as last asked of the consumer; its lock
    /// serializes ``reconcilePauses(_:)``.
    let pauses = Locked(Set<TopicPartition>())
    /// What is relay-wide: the lanes' budget and the idle waiters.
    /// Taken inside a shard's step on its loop where the step changes both.
    let state: Locked<State>
    /// The shards, one per work executor unless ``RelayApplication`` was told how many: each owns
    /// its partitions and their devices' queues (``Shard``, ``shard(of:)``), confined to its
    /// event loop (shard N on work executor N modulo their count).
    ///
    /// The work executors are the event loops the APNs connections live on (NIO's shared loops,
    /// one per core): each work group of one shard's intents runs on its shard's, as do the
    /// tasks of intents taken from mailboxes and of turns that leave the callbacks
    /// (``shardExecutor(of:)``). On the loop of the connection that sends it, an intent's send
    /// and answer need no thread hop: against Swift's global executor, the relay's CPU per
    /// intent in `bench e2e` went from 53.5 to 48.1 µs (docs/performance.md). Every loop holds a
    /// connection when `apns.connections` is at least the number of cores; on a loop without
    /// one, a send hops to its connection's loop. Making an APNs client (its TLS context)
    /// happens on these loops too, rarely; a partition's pause or resume is only asked here
    /// (the consumer's poll thread calls librdkafka, ``KafkaConsumer/pause(_:)``).
    let shards: [ShardBox]
    /// A revocation's wait for its partitions' work at APNs, on the consumer's poll thread.
    let revocation: RevocationCoordinator
    /// Which shard each owned partition number is on: changed by the reader's rebalances, read
    /// wherever a partition (not an item) names its shard.
    let placement: Locked<ShardPlacement>
    /// Per team, its credential's fault and cool-down (``CredentialFaultBreaker``): asked before
    /// each send, its own lock.
    let credentialFaults: Locked<CredentialFaultBreaker>
    let logger: Logger
    let clock: @Sendable () -> Int64
    let backoff: Backoff
    /// Opened by ``requestStop()``: consuming stops and in-flight work drains.
    let stopping = AsyncLatch()
    /// The mailbox members worked on here (parks under way, intents taken from a mailbox).
    let mailboxJobs = MailboxJobs()
    /// For tests: called between a mailbox poll's due-index read and its takes, with the
    /// partitions that had due entries (where a rebalance can take one away).
    let afterDueRead = LockedFunction<@Sendable ([TopicPartition]) -> Void>()
    /// Opened once in-flight work finished or the shutdown deadline passed: what is still
    /// running is cancelled.
    let abandoning = AsyncLatch()
    /// Opened once the ``MailboxDeliverer`` ended (at once without Redis): the pipeline's run
    /// ends after it, so that the service group never sees the pipeline end while it waits
    /// for the deliverer (that would cancel the group instead of shutting it down in order).
    let mailboxesEnded = AsyncLatch()
    /// Opened once the relay started consuming (its Redis' guarantees checked): ready from then
    /// until it stops.
    let consuming = AsyncLatch()
    /// Intents that need neither Redis nor an invalidation record nor tracing are driven by
    /// callbacks from consume to outcome (``driveByCallbacks(_:)``) instead of a task each; off
    /// only where `bench e2e --task-per-intent` measures the task per intent (docs/performance.md).
    let drivesByCallbacks: Bool
    /// Intents that went that way so far.
    let drivenByCallbacks = Atomic<Int>(0)
    /// Intents consumed beside an intent of their device from another shard's partition
    /// (``acrossShards(_:_:shards:)``), so far.
    let intentsAcrossShards = Atomic<Int>(0)
    /// Where outcomes go (the outcomes topic), and what publishing keeps: the batched
    /// records' reports (handed to ``outcomesDelivered(_:)``), the count by status, the hook.
    let outcomes: OutcomePublisher
    public var intentsDrivenByCallbacks: Int { drivenByCallbacks.load(ordering: .relaxed) }
    /// Turns of intents driven by callbacks that went on in a task (``inTurnTask(for:_:)``: a park,
    /// a 429 in shadow mode, a failed record or outcome, the next intent of a device that does
    /// not qualify or after an item that ended without waiting), so far.
    let turnsInTasks = Atomic<Int>(0)
    public var callbackTurnsInTasks: Int { turnsInTasks.load(ordering: .relaxed) }
    /// Retries driven by callbacks waiting out their backoff.
    let backoffTimers = BackoffTimers()
    /// Retries in a task waiting out their backoff (``backOff(_:_:)``).
    let tasksInBackoff = Atomic<Int>(0)
    /// Retries waiting out their backoff now, by callbacks or in a task.
    public var retriesWaitingOutBackoff: Int { backoffTimers.count + tasksInBackoff.load(ordering: .relaxed) }
    /// The relay's incidents (Redis, outcome deliveries, Kafka's reachability), which it owns.
    let health: RelayHealth
    /// Redis failing and outcome deliveries failing, as they happen: read by `/readyz` and
    /// the accessors below, waited on by whoever needs to see one begin or end.
    public var incidents: AsyncWatched<RelayIncidents> { health.incidents }
    /// Nil unless `tracing.otlp_endpoint` is set: then sampled intents record spans.
    let tracer: (any Tracer)?
    /// Nil without Redis (`redis.url` empty); the policy, badges and the fleet's tokens share it.
    let redis: RedisClient?
    let deduplicator: Deduplicator?
    let policy: DevicePolicy?
    let badges: BadgeStore?
    let liveActivityPacer: LiveActivityPacer?

    /// The relay-wide part of the pipeline's state; each shard's part is its ``Shard``.
    struct State {
        /// Per lane: intents in flight and waiting, backlogs, the admitting tasks' waits.
        var lanes: LaneLedger<CheckedContinuation<Void, Never>>
        /// Intents between consume and outcome, the waiting ones included.
        var inFlight: Int { lanes.totalInFlight }
        /// Of those, the ones waiting behind an earlier intent for their device (not started).
        var waiting: Int { lanes.totalWaiting }
        /// Waiting for `inFlight` to reach 0 (``idle(within:)``), by waiter.
        var idleWaiters: [Int: CheckedContinuation<Bool, Never>] = [:]
        var nextIdleWaiter = 0
        var firstConsumedAt: ContinuousClock.Instant?
    }

    /// Made by ``RelayApplication``, which builds the clients (none of them connects yet).
    init(configuration: RelayConfiguration, clients: RelayClients, worker: String?, logger: Logger,
         clock: @escaping @Sendable () -> Int64, published: (@Sendable (Outcome) -> Void)?, drivesByCallbacks: Bool = false,
         shards: Int? = nil, countsShardTurns: Bool = false) {
        self.configuration = configuration
        self.drivesByCallbacks = drivesByCallbacks
        self.worker = worker ?? "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
        self.logger = logger
        self.health = RelayHealth(logger: logger, failOpen: configuration.redis.failOpen,
                                  unreadyAfterUnreachableSeconds: configuration.kafka.unreadyAfterUnreachableSeconds)
        self.clock = clock
        let lanes = configuration.kafka.intentLanes
        let weights = Set(lanes.map(\.weight)).sorted()
        let precedence = lanes.map { min(weights.firstIndex(of: $0.weight) ?? 0, 3) }
        self.lanePrecedence = precedence
        self.state = Locked(State(
            lanes: LaneLedger(weights: configuration.kafka.intentLanes.map(\.weight), maxInFlight: configuration.limits.maxInFlight,
                              maxWaiting: configuration.limits.maxWaiting)))
        let shardCount = max(shards ?? clients.workExecutors.count, 1)
        // Every shard has a loop: work executor `index` modulo their count, or without work
        // executors one of NIO's shared loops for them all.
        let executors = clients.workExecutors.isEmpty ? [EventLoopTaskExecutor(eventLoop: MultiThreadedEventLoopGroup.singleton.next())]
            : clients.workExecutors
        self.shards = (0..<shardCount).map { index in
            ShardBox(index: index, executor: executors[index % executors.count],
                     countsTurns: countsShardTurns, Shard(partitions: PartitionLedger(uncommittedLimit: configuration.limits.maxUncommittedPerPartition,
                                                                     shard: index, of: shardCount),
                                         queues: DeviceQueues(precedence: precedence)))
        }
        self.placement = Locked(ShardPlacement(shards: shardCount))
        self.credentialFaults = Locked(CredentialFaultBreaker(cooldownSeconds: configuration.retry.credentialFaultCooldownSeconds))
        self.backoff = Backoff(base: .milliseconds(configuration.retry.initialBackoffMilliseconds),
                               maximum: .milliseconds(configuration.retry.maxBackoffMilliseconds))
        self.revocation = RevocationCoordinator(shutdownDeadlineSeconds: configuration.shutdownDeadlineSeconds,
                                                consumerSettings: configuration.kafka.consumerSettings,
                                                backoffMaximum: .milliseconds(configuration.retry.maxBackoffMilliseconds), logger: logger)
        let topics = RelayConfiguration.effectiveTopics(configuration.apns.credentials, clients.credentials)
        self.credentials = CredentialDirectory(topics: topics, exact: clients.credentials.map(\.isCertificate))
        self.credentialTeams = clients.credentials.map(\.team)
        self.certificates = clients.credentials.map(\.certificate)
        self.redis = clients.redis
        let keys = RedisKeys(prefix: configuration.redis.keyPrefix)
        // The shards' loops, each once: shard `index` runs on executor `index` modulo their count.
        let shardLoops = executors.prefix(shardCount).map(\.eventLoop)
        self.deduplicator = clients.redis.map { Deduplicator(client: $0, keys: keys, loops: shardLoops) }
        self.policy = clients.redis.map {
            var policy = DevicePolicy(client: $0, keys: keys, intentsTopic: configuration.kafka.intentsTopic,
                                      backoffBaseMilliseconds: configuration.policy.backoffInitialSeconds * 1000,
                                      backoffMaximumMilliseconds: configuration.policy.backoffMaxSeconds * 1000)
            // A quarter of the call's deadline: the call ends inside it, and a WAIT that finds
            // too few replicas holds the calls pipelined behind it on its connection briefly.
            policy.parkReplicas = (configuration.redis.parkMinReplicas, max(configuration.redis.timeoutMilliseconds / 4, 1))
            policy.namesLanes = !configuration.kafka.lanes.isEmpty
            policy.claimLeaseMilliseconds = Int64(configuration.policy.mailboxClaimLeaseSeconds) * 1000
            return policy
        }
        self.badges = clients.redis.map { BadgeStore(client: $0, keys: keys, appliedTTL: configuration.policy.longestDedupeWindowSeconds) }
        self.liveActivityPacer = clients.redis.map { LiveActivityPacer(client: $0, keys: keys) }
        if policy == nil { mailboxesEnded.open() }
        RelayMetrics.register(teamIDs: credentialTeams, topics: topics.flatMap { $0 })
        self.clients = clients.apns
        self.tracer = clients.tracing?.tracer
        self.endpoints = Self.endpoints(configuration.apns.endpoint)
        self.laneTopics = lanes.map(\.topic)
        self.laneMetrics = lanes.map { RelayMetrics.Lane(topic: $0.topic) }
        self.producer = clients.producer
        self.consumer = clients.consumer
        self.outcomes = OutcomePublisher(producer: clients.producer, topic: configuration.kafka.outcomesTopic, logger: logger,
                                         hook: published)
        clients.consumer.onRevoking { [weak self] partitions, lost in
            self?.partitionsRevoking(partitions, lost: lost)
        }
        outcomes.deliverReports { [weak self] reports in self?.outcomesDelivered(reports) }
    }

    /// Outcomes published so far, by status.
    public var outcomeCounts: [String: Int] { outcomes.counts }
    /// Outcome deliveries Kafka has failed so far (each is retried until it is delivered).
    public var publishFailures: Int { incidents.value.publishFailures }
    /// Times Redis started failing (each outage counted once, when it begins).
    public var redisOutages: Int { incidents.value.redisOutages }
    /// Revocations whose commit the coordinator refused (their work may be sent again by the
    /// partitions' next owners).
    public var revocationCommitFailures: Int { consumer.revocationCommitFailures }

    /// Not alive once the outcome producer hit a fatal error: no outcome can be published again
    /// (their intents stay uncommitted), so the process must be restarted.
    public var notAliveReason: String? {
        if let refusal { return refusal }
        if let failure = consumer.failure { return "intents consumer failed: \(failure)" }
        return producer.fatalError.map { "outcome producer failed: \($0)" }
    }

    /// Why the relay stopped on its own and must not be run as it is configured: its Redis
    /// can evict parked intents (``RedisGuarantees``). `run` exits with an error then.
    public var refusal: String? { incidents.value.refusal }

    /// Why the relay is not ready, or nil when it is: ready means started and consuming, alive,
    /// and not stopping. Its dependencies' health is not part of it (see
    /// ``dependencyProblems``): during a Redis or APNs incident every relay would be unready at
    /// once, and a PodDisruptionBudget would then keep `kubectl drain` from evicting any of them,
    /// while nothing is gained (the relays take no traffic from a Service; Kafka hands them
    /// their work).
    ///
    /// One dependency is: a consumer that has reached no Kafka broker for
    /// `kafka.unready_after_unreachable_seconds` is not ready (it has no work to do, and a
    /// rollout should not replace ready relays by ones that cannot reach Kafka either). The
    /// chart's PodDisruptionBudget evicts unready pods whatever its budget
    /// (`unhealthyPodEvictionPolicy: AlwaysAllow`), so a Kafka outage blocks no node drain.
    public var notReadyReason: String? {
        if stopping.isOpen { return "stopping" }
        if let dead = notAliveReason { return dead }
        if !consuming.isOpen { return "starting" }
        return health.kafkaNotReadyReason
    }

    /// librdkafka's statistics of the producer or the consumer (`client`): metrics, and for
    /// the consumer, whether any broker is reachable (readiness).
    func kafkaStatistics(_ statistics: KafkaStatistics, client: String) {
        guard client == "consumer" else { return RelayMetrics.kafkaStatistics(statistics, client: client) }
        // Only the partitions assigned now: librdkafka keeps listing a revoked one (`stopped`).
        var assigned = statistics
        let owned = Set(consumer.assignment)
        assigned.partitions = statistics.partitions.filter { owned.contains(TopicPartition(topic: $0.topic, partition: $0.partition)) }
        RelayMetrics.kafkaStatistics(assigned, client: client)
        health.consumerReaches(statistics.brokers.contains(where: \.isUp), brokers: statistics.brokers.map { "\($0.name) \($0.state)" })
    }

    /// What the relay's dependencies lack now, one line each, empty when nothing: Redis failing
    /// (and what the relay does meanwhile), an APNs client without a ready connection. Shown by
    /// `/readyz?verbose`; the metrics (`apns_relay_redis_errors_total`, `apns_relay_apns_connections_ready`) and
    /// their alerts say the same to Prometheus.
    public var dependencyProblems: [String] {
        var problems = health.redisProblem.map { [$0] } ?? []
        for (key, client) in clients.all where client.readyConnections == 0 {
            problems.append("no ready APNs connection for \(key.endpoint)")
        }
        return problems
    }

    /// Settings that weaken the relay: shown on `/readyz` (and logged at start-up by `run`).
    public var warnings: [String] {
        configuration.apns.insecureSkipVerify ? ["apns.insecure_skip_verify is on: APNs' TLS certificate is not verified"] : []
    }

    /// When the first intent was consumed (for throughput figures).
    public var firstConsumedAt: ContinuousClock.Instant? { state.withLock { $0.firstConsumedAt } }

    /// Intents between consume and outcome now.
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// Intents whose sends are under way (in flight, not waiting behind an earlier intent of
    /// their device): at most `limits.max_in_flight`.
    public var sending: Int { state.withLock { $0.lanes.sending } }

    /// Partitions paused now because `limits.max_uncommitted_per_partition` of their offsets
    /// wait behind an unfinished intent.
    public var heldPartitions: [Int32] { heldNow.map(\.partition).sorted() }

    /// The intents partitions (of every lane) this relay owns now.
    public var ownedPartitions: [(topic: String, partition: Int32)] {
        owned.map { ($0.topic, $0.partition) }
    }

    /// The lane of an intents topic (0 for a topic that is none of them).
    func lane(of topic: String) -> Int {
        laneTopics.firstIndex(of: topic) ?? 0
    }

    /// Log metadata naming one intent.
    func metadata(_ item: WorkItem, _ extra: Logger.Metadata = [:]) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(item.offset)",
        ]
        switch item.intent {
        case .success(let intent):
            metadata["intent.id"] = "\(intent.id)"
            metadata["apns.topic"] = "\(intent.topic)"
        case .failure(let invalid):
            metadata["intent.id"] = "\(invalid.id ?? "none")"
            if let topic = invalid.topic { metadata["apns.topic"] = "\(topic)" }
        }
        return metadata.merging(extra) { $1 }
    }
}
