public import APNs
import Foundation
import Kafka
public import Logging
import NIOPosix
import Redis
public import ServiceLifecycle

/// The clients one relay talks through. Built from the configuration; none of them does I/O
/// before its service runs or its first use.
struct RelayClients {
    /// Nil without Redis (`redis.url` empty).
    let redis: RedisClient?
    let apns: APNsClientRegistry
    let producer: KafkaProducer
    let consumer: KafkaConsumer
    /// The credentials the APNs clients connect with, in `apns.credentials` order.
    let credentials: [LoadedCredential]
    /// Where intents' work runs: the event loops of the APNs connections (see
    /// ``RelayPipeline/workExecutors``).
    let workExecutors: [EventLoopTaskExecutor]
    /// Spans of traced intents start from its tracer (nil: `tracing.otlp_endpoint` is empty).
    var tracing: RelayTracing? = nil
}

/// Everything one configuration runs, built in one place: the clients (Redis, the APNs
/// clients, the outcome producer, the intents consumer) and the ``RelayPipeline`` between them.
///
/// ``run()`` runs them as one `ServiceGroup`, in this order, so that a graceful shutdown (or
/// ``requestStop()``) stops them in the reverse one:
///
/// 1. the pipeline stops consuming and the mailbox deliverer (with Redis) stops taking entries;
///    the pipeline finishes or abandons its in-flight work by the shutdown deadline, and
///    flushes its outcomes;
/// 2. the consumer commits the stored offsets and leaves the group;
/// 3. the producer flushes what is left and closes;
/// 4. the APNs clients close (requests still open a second later are cut);
/// 5. Redis closes.
///
/// A configuration reload makes a new application from the new configuration (`run` drains the
/// old one first): this initialiser is the one place where the relay is built.
public final class RelayApplication: Service, Sendable {
    public let configuration: RelayConfiguration
    /// One loaded credential (signing key or certificate) per `configuration.apns.credentials`
    /// entry, as read when this application was made (see
    /// ``init(configuration:credentials:worker:logger:clock:published:)``).
    public let credentials: [LoadedCredential]
    public let pipeline: RelayPipeline
    private let clients: RelayClients
    private let logger: Logger

    /// - Parameters:
    ///   - credentials: the credentials' keys and certificates, in `configuration.apns.credentials`
    ///     order; nil reads them from their files now. A reload passes the ones it validated, so
    ///     a file that changes while the running relay drains does not reach the new one unchecked.
    ///   - worker: names this relay in outcomes and logs (default: host name and process id).
    ///   - clock: epoch seconds (tests inject one).
    ///   - published: called with every outcome once its delivery report succeeded (benchmarks).
    ///   - deliveryByCallbacks: intents without Redis, invalidation records or tracing go from
    ///     consume to outcome by callbacks, not a task each (``RelayPipeline/drivesByCallbacks``);
    ///     false runs a task per intent, which the benchmark measures against it.
    ///   - shards: how many shards the pipeline's partitions are spread over (at least one);
    ///     nil: one per event loop of NIO's shared group, which has one per core. Tests fix it,
    ///     so that what runs only with one shard, or only with several, runs whatever the
    ///     machine's core count.
    ///   - countsShardTurns: counts the turns of the shards' states, and the hops to a shard's
    ///     event loop they took (``RelayPipeline/shardTurns``), for `bench e2e`; off, a turn
    ///     pays one test of a constant.
    public init(configuration: RelayConfiguration, credentials: [LoadedCredential]? = nil, worker: String? = nil,
                logger: Logger = Logger(label: "apns-relay"),
                clock: @escaping @Sendable () -> Int64 = LocalProviderTokenSource.systemClock,
                published: (@Sendable (Outcome) -> Void)? = nil, deliveryByCallbacks: Bool = true, shards: Int? = nil,
                countsShardTurns: Bool = false) throws {
        precondition(shards.map { $0 >= 1 } ?? true, "a pipeline has at least one shard")
        let credentials = try credentials ?? configuration.loadCredentials()
        guard credentials.count == configuration.apns.credentials.count else {
            throw APNsError.credential("\(credentials.count) loaded credentials for \(configuration.apns.credentials.count) configured")
        }
        self.configuration = configuration
        self.credentials = credentials
        self.logger = logger
        var redis: RedisClient?
        if !configuration.redis.url.isEmpty {
            redis = try RedisClient(configuration: configuration.redis.clientConfiguration(), logger: logger)
        }
        let tokenSources = try credentials.map { [redis] credential -> (any ProviderTokenSource)? in
            guard case .token(let signer) = credential else { return nil }
            signer.registerMetrics()
            if let redis { return try RedisProviderTokenSource(signer: signer, redis: redis, keyPrefix: configuration.redis.keyPrefix,
                                                                      clock: clock, logger: logger) }
            return try LocalProviderTokenSource(signer: signer, clock: clock)
        }
        RelayMetrics.certificateExpiries(credentials.compactMap(\.certificate))
        let apns = configuration.apns
        let proxy = try apns.parsedProxy()
        let queued = max(configuration.limits.maxInFlight, 1000)
        // Every APNs client's connections live on NIO's shared event loops (one per core), and
        // intents' work runs on the same loops: a send reaches its connection, and its answer
        // resumes the intent, without waking another thread.
        let loops = MultiThreadedEventLoopGroup.singleton
        let registry = APNsClientRegistry { key in
            let credential: APNsCredential = switch credentials[key.credential] {
            case .token: .token(tokenSources[key.credential]!)
            case .certificate(let identity): .certificate(chain: identity.chain, key: identity.key)
            }
            var settings = APNsClientConfiguration(endpoint: key.endpoint, credential: credential)
            settings.connections = apns.connections
            settings.insecureSkipVerify = apns.insecureSkipVerify
            settings.proxy = proxy
            settings.requestTimeout = .seconds(Int64(apns.requestTimeoutSeconds))
            settings.maxQueuedNotifications = queued
            settings.credentialLabel = credentials[key.credential].metricsName
            return try APNsClient(configuration: settings, eventLoopGroup: loops, logger: logger)
        }
        let producer = try KafkaProducer(bootstrapServers: configuration.kafka.brokers,
                                         properties: configuration.kafka.producerSettings.merging(Self.statistics) { given, _ in given },
                                         logger: logger)
        let consumer = try KafkaConsumer(bootstrapServers: configuration.kafka.brokers,
                                         groupID: configuration.kafka.groupID,
                                         topics: configuration.kafka.intentTopics,
                                         properties: Self.consumerProperties(configuration.kafka),
                                         maxBatch: 1000, bufferedMessages: 5000,
                                         topicQueues: configuration.kafka.intentLanes.count > 1,
                                         outstandingPerTopic: RelayPipeline.laneBacklogLimit, logger: logger)
        clients = RelayClients(redis: redis, apns: registry, producer: producer, consumer: consumer, credentials: credentials,
                               workExecutors: loops.makeIterator().map { EventLoopTaskExecutor(eventLoop: $0) },
                               tracing: configuration.tracing.otlpEndpoint.isEmpty ? nil
                                   : try RelayTracing(endpoint: configuration.tracing.otlpEndpoint,
                                                      protocol: configuration.tracing.otlpProtocol, logger: logger))
        pipeline = RelayPipeline(configuration: configuration, clients: clients, worker: worker, logger: logger,
                                 clock: clock, published: published, drivesByCallbacks: deliveryByCallbacks, shards: shards,
                                 countsShardTurns: countsShardTurns)
        // librdkafka's statistics (``statistics``) become metrics and readiness.
        // Weak: the clients outlive no pipeline through their handlers (a reload frees the old one).
        producer.onStatistics { [weak pipeline] in pipeline?.kafkaStatistics($0, client: "producer") }
        consumer.onStatistics { [weak pipeline] in pipeline?.kafkaStatistics($0, client: "consumer") }
    }


    /// What the consumer is given: `kafka.config` and `kafka.consumer_config`, over librdkafka's
    /// statistics (``statistics``) and, with several lanes, the `range` assignor.
    ///
    /// With lanes, each lane is a topic of its own, and cooperative-sticky (the consumer's
    /// default) assigns every topic's partitions on its own: a device's urgent and bulk intents
    /// could be consumed, and sent, by two relays at once (its badge going backwards, its bucket
    /// overrun by a burst per lane). `range` gives partition N of every lane to the same relay
    /// when the lanes have as many partitions each, so a device's intents of every lane are one
    /// relay's (docs/lanes.md says what upstream services and the topics must do for that). Its
    /// rebalances are eager: each one revokes every partition of the group, which waits for the
    /// work at APNs as any revocation does. A `partition.assignment.strategy` in the
    /// configuration wins.
    static func consumerProperties(_ kafka: RelayConfiguration.Kafka) -> [String: String] {
        var defaults = statistics
        if kafka.intentLanes.count > 1 { defaults["partition.assignment.strategy"] = "range" }
        return kafka.consumerSettings.merging(defaults) { given, _ in given }
    }

    /// librdkafka's statistics every 15 s unless `kafka.config` says otherwise
    /// (`statistics.interval.ms`; 0 turns them off): brokers, the producer's queue and the fetch
    /// state become metrics (``RelayMetrics/kafkaStatistics(_:client:)``) and readiness.
    static let statistics = ["statistics.interval.ms": "15000"]

    /// Checks what the initialiser's clients would refuse in `configuration`, without making any
    /// client: the Redis URL and the librdkafka settings. (The credentials' key files are read
    /// by whoever checks a change for them; the initialiser reads them again.)
    public static func validateClientSettings(_ configuration: RelayConfiguration) throws {
        if !configuration.redis.url.isEmpty { _ = try RedisURL(parsing: configuration.redis.url) }
        try KafkaSettings.validate(configuration.kafka.consumerSettings)
        try KafkaSettings.validate(configuration.kafka.producerSettings)
    }

    /// Everything that keeps `configuration` from starting, all at once: its
    /// ``RelayConfiguration/preflightProblems`` (the files it names) and what the clients would
    /// refuse (``validateClientSettings(_:)``). `check-config`, `run` and a reload ask this.
    /// With the warnings and the credentials the check read, for
    /// ``init(configuration:credentials:worker:logger:clock:published:)`` when there is no problem.
    public static func startProblems(_ configuration: RelayConfiguration) -> PreflightResult {
        var result = configuration.preflight()
        if !configuration.tracing.otlpEndpoint.isEmpty {
            result.problems += RelayTracing.environmentProblems(ProcessInfo.processInfo.environment)
        }
        do {
            try validateClientSettings(configuration)
        } catch {
            result.problems.append("\(error)")
        }
        return result
    }

    /// Runs the clients and the pipeline until ``requestStop()``, a graceful shutdown of the
    /// service group this runs in, or cancellation; returns once everything closed, in the
    /// order above.
    public func run() async {
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        // Stops after the pipeline: the last outcomes' spans go out.
        if let tracing = clients.tracing { services.append(.init(service: tracing.service)) }
        if let redis = clients.redis { services.append(.init(service: redis)) }
        services += [
            .init(service: clients.apns),
            .init(service: clients.producer),
            .init(service: clients.consumer),
            // The pipeline ending (asked to stop) shuts the rest down, in reverse order.
            .init(service: pipeline, successTerminationBehavior: .gracefullyShutdownGroup),
        ]
        // Shut down first: it stops taking from mailboxes as the pipeline stops consuming, and
        // ends once the pipeline's work drained or was abandoned.
        if clients.redis != nil {
            services.append(.init(service: MailboxDeliverer(pipeline: pipeline), successTerminationBehavior: .ignore))
        }
        let group = ServiceGroup(configuration: .init(services: services, logger: logger))
        await withGracefulShutdownHandler {
            do {
                try await group.run()
            } catch {
                logger.error("the relay's services stopped with an error", metadata: ["relay.error": "\(error)"])
            }
        } onGracefulShutdown: {
            self.pipeline.requestStop()
        }
        logger.info("relay stopped", metadata: ["relay.outcomes": "\(pipeline.outcomeCounts)"])
    }

    /// Asks the relay to stop: the pipeline drains, then the clients close.
    public func requestStop() {
        pipeline.requestStop()
    }
}
