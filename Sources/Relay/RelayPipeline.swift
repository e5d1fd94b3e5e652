public import APNs
import Foundation
import Kafka
public import Logging
import NIOCore
import Synchronization

/// The relay's main job: intents from Kafka, notifications to APNs, one outcome per intent back
/// to Kafka, offsets committed only behind delivered outcomes (at-least-once).
///
/// - Every consumed message is answered: unusable ones with `invalid` at once (a poison message
///   never blocks its partition), the rest after APNs answered, retries included.
/// - Intents for one device token go out one after another, in offset order.
/// - Retryable answers are retried with exponential backoff and jitter until the intent's
///   expiration or the retry deadline; expiration 0 means one attempt.
/// - A credential fault stops sends for that team only, for a cool-down, then one intent probes.
/// - At most `limits.maxInFlight` intents are between consume and outcome; past that the loop
///   stops reading, the consumer's bounded buffer fills and it pauses its partitions.
/// - An offset becomes committable once its outcome's delivery report succeeded and every
///   earlier offset of the partition is done. Work for revoked partitions is dropped unsent
///   where it has not reached APNs, and its offsets are never stored.
public final class RelayPipeline: RelayStatus {
    public let configuration: RelayConfiguration
    public let worker: String
    private let consumer: KafkaConsumer
    private let producer: KafkaProducer
    private let credentials: CredentialDirectory
    private let tokenSources: [LocalProviderTokenSource]
    private let clients: Mutex<[String: APNsClient]>
    private let state = Mutex(State())
    private let logger: Logger
    private let clock: @Sendable () -> Int64
    private let backoff: Backoff
    private let stopRequested = Mutex(false)

    struct State {
        var trackers: [TopicPartition: OffsetTracker] = [:]
        /// Bumped when a partition is revoked: work from an older generation is abandoned.
        var generations: [TopicPartition: Int] = [:]
        var devices: [String: CircularBuffer<WorkItem>] = [:]
        var inFlight = 0
        var capacityWaiter: CheckedContinuation<Void, Never>?
        var drainedWaiter: CheckedContinuation<Void, Never>?
        var disabledTeams: [String: (until: Int64, reason: String)] = [:]
        var outcomeCounts: [String: Int] = [:]
        var firstConsumedAt: ContinuousClock.Instant?
    }

    struct WorkItem: Sendable {
        var partition: TopicPartition
        var offset: Int64
        var generation: Int
        var consumedAt: ContinuousClock.Instant
        var intent: Result<Intent, InvalidIntent>
    }

    /// - Parameter clock: epoch seconds (tests inject one).
    public init(configuration: RelayConfiguration, worker: String? = nil,
                logger: Logger = Logger(label: "apns-relay"),
                clock: @escaping @Sendable () -> Int64 = LocalProviderTokenSource.systemClock) throws {
        self.configuration = configuration
        self.worker = worker ?? "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
        self.logger = logger
        self.clock = clock
        self.backoff = Backoff(base: .milliseconds(configuration.retry.initialBackoffMilliseconds),
                               maximum: .milliseconds(configuration.retry.maxBackoffMilliseconds))
        self.credentials = CredentialDirectory(configuration.apns.credentials)
        self.tokenSources = try configuration.apns.credentials.map { credential in
            let signer = try ProviderTokenSigner(teamID: credential.teamID, keyID: credential.keyID, keyFile: credential.keyFile)
            return try LocalProviderTokenSource(signer: signer)
        }
        self.clients = Mutex([:])
        self.producer = try KafkaProducer(bootstrapServers: configuration.kafka.brokers,
                                          properties: configuration.kafka.properties, logger: logger)
        self.consumer = try KafkaConsumer(bootstrapServers: configuration.kafka.brokers,
                                          groupID: configuration.kafka.groupID,
                                          topics: [configuration.kafka.intentsTopic],
                                          properties: configuration.kafka.properties,
                                          maxBatch: 1000, bufferedMessages: 5000, logger: logger)
    }

    /// Outcomes published so far, by status.
    public var outcomeCounts: [String: Int] { state.withLock { $0.outcomeCounts } }

    /// Not alive once the outcome producer hit a fatal error: no outcome can be published again
    /// (their intents stay uncommitted), so the process must be restarted.
    public var notAliveReason: String? {
        producer.fatalError.map { "outcome producer failed: \($0)" }
    }

    /// Why the relay is not ready to take traffic, or nil when it is: it is running and not
    /// stopping, it is alive, and every APNs client it has opened has a ready connection.
    public var notReadyReason: String? {
        if stopRequested.withLock({ $0 }) { return "stopping" }
        if let dead = notAliveReason { return dead }
        let clients = clients.withLock { Array($0) }
        for (key, client) in clients where client.readyConnections == 0 {
            return "no ready APNs connection for \(key.split(separator: "|").last.map(String.init) ?? key)"
        }
        return nil
    }

    /// When the first intent was consumed (for throughput figures).
    public var firstConsumedAt: ContinuousClock.Instant? { state.withLock { $0.firstConsumedAt } }

    /// Intents between consume and outcome now.
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// Asks ``run()`` to stop consuming and drain.
    public func requestStop() {
        stopRequested.withLock { $0 = true }
    }

    /// Consumes until ``requestStop()`` or cancellation, then finishes in-flight work within the
    /// shutdown deadline, flushes the producer, commits and leaves the group.
    public func run() async {
        logger.info("relay started", metadata: ["relay.worker": "\(worker)", "kafka.topic": "\(configuration.kafka.intentsTopic)"])
        let consuming = Task { await consume() }
        var lastLagReport = ContinuousClock.now
        while !stopRequested.withLock({ $0 }) && !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(100))
            if ContinuousClock.now - lastLagReport >= .seconds(5) {
                lastLagReport = .now
                for (partition, records) in consumer.lag {
                    RelayMetrics.consumerLag(partition: partition.partition, records: records)
                }
            }
        }
        consuming.cancel()
        await consuming.value
        await drain()
        _ = await producer.flush(timeout: .seconds(10))
        await consumer.close()
        await producer.close()
        for client in clients.withLock({ Array($0.values) }) { await client.shutdown() }
        logger.info("relay stopped", metadata: ["relay.outcomes": "\(outcomeCounts)"])
    }

    // MARK: Consuming

    private func consume() async {
        for await event in consumer.events {
            switch event {
            case .assigned(let partitions):
                state.withLock { state in
                    for partition in partitions {
                        state.trackers[partition] = OffsetTracker()
                        state.generations[partition, default: 0] += 1
                    }
                }
                logger.info("partitions assigned", metadata: ["kafka.partitions": "\(partitions)"])
            case .revoked(let partitions):
                state.withLock { state in
                    for partition in partitions {
                        state.trackers[partition] = nil
                        state.generations[partition, default: 0] += 1
                    }
                }
                logger.info("partitions revoked", metadata: ["kafka.partitions": "\(partitions)"])
            case .messages(let batch):
                for message in batch {
                    await waitForCapacity()
                    if Task.isCancelled { return }
                    admit(message)
                }
            case .error(let error):
                logger.warning("consumer error", metadata: ["kafka.error": "\(error)"])
            }
            if Task.isCancelled { return }
        }
    }

    private func waitForCapacity() async {
        let limit = configuration.limits.maxInFlight
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if state.inFlight < limit || Task.isCancelled { return true }
                    state.capacityWaiter = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.capacityWaiter = nil }
                return state.capacityWaiter
            }
            waiter?.resume()
        }
    }

    private func admit(_ message: KafkaMessage) {
        let parsed: Result<Intent, InvalidIntent>
        do {
            parsed = .success(try Intent.parse(message.value, key: message.key, now: clock(),
                                               defaultTTL: configuration.defaults.expirationSeconds))
        } catch {
            parsed = .failure(error)
        }
        let partition = message.topicPartition
        let (startDevice, inFlight) = state.withLock { state -> (WorkItem?, Int) in
            guard state.trackers[partition] != nil, let generation = state.generations[partition] else {
                return (nil, state.inFlight)
            }
            if state.firstConsumedAt == nil { state.firstConsumedAt = .now }
            state.trackers[partition]!.started(message.offset)
            state.inFlight += 1
            let item = WorkItem(partition: partition, offset: message.offset, generation: generation,
                                consumedAt: .now, intent: parsed)
            guard case .success(let intent) = parsed else { return (item, state.inFlight) }
            if state.devices[intent.token] != nil {
                state.devices[intent.token]!.append(item)
                return (nil, state.inFlight)
            }
            state.devices[intent.token] = CircularBuffer()
            return (item, state.inFlight)
        }
        RelayMetrics.intentsConsumed.increment()
        RelayMetrics.inFlight.record(inFlight)
        guard let item = startDevice else { return }
        Task { await self.work(item) }
    }

    /// Runs one item, then the items queued behind it for the same device, in order.
    private func work(_ first: WorkItem) async {
        var next: WorkItem? = first
        while let item = next {
            await handle(item)
            guard case .success(let intent) = item.intent else { return }
            next = state.withLock { state in
                if let queued = state.devices[intent.token]?.popFirst() { return queued }
                state.devices[intent.token] = nil
                return nil
            }
        }
    }

    private func handle(_ item: WorkItem) async {
        var metadata: Logger.Metadata = [
            "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(item.offset)",
        ]
        let outcome: Outcome?
        switch item.intent {
        case .failure(let invalid):
            metadata["intent.id"] = "\(invalid.id ?? "none")"
            logger.info("invalid intent", metadata: metadata.merging(["intent.reason": "\(invalid.reason)"]) { $1 })
            outcome = makeOutcome(item, id: invalid.id, token: invalid.token, topic: invalid.topic, status: .invalid,
                                  reason: "\(invalid.reason): \(invalid.message)")
        case .success(let intent):
            metadata["intent.id"] = "\(intent.id)"
            outcome = await deliver(intent, item, metadata: metadata)
        }
        guard let outcome else {
            finish(item, stored: false)
            return
        }
        await publish(outcome, item, metadata: metadata)
    }

    // MARK: Delivering

    private func isCurrent(_ item: WorkItem) -> Bool {
        state.withLock { $0.trackers[item.partition] != nil && $0.generations[item.partition] == item.generation }
    }

    /// Sends with retries; nil when the work was abandoned (its partition was revoked).
    private func deliver(_ intent: Intent, _ item: WorkItem, metadata: Logger.Metadata) async -> Outcome? {
        guard let credentialIndex = credentials.index(forTopic: intent.topic) else {
            return makeOutcome(item, intent: intent, status: .failed, reason: "NoCredentials")
        }
        let teamID = configuration.apns.credentials[credentialIndex].teamID
        let retryDeadline = clock() + configuration.retry.deadlineSeconds
        let notification = intent.notification
        var attempts = 0
        var retry = 0
        var lastReason: String?
        while true {
            guard isCurrent(item), !Task.isCancelled else { return nil }
            let now = clock()
            if intent.expiration != 0, now > intent.expiration {
                return makeOutcome(item, intent: intent, status: .expired, reason: lastReason ?? "ExpiredBeforeSending", attempts: attempts)
            }
            if let fault = activeCredentialFault(teamID: teamID, now: now) {
                return makeOutcome(item, intent: intent, status: .failed, reason: fault, attempts: attempts)
            }
            let client: APNsClient
            do {
                client = try self.client(credentialIndex: credentialIndex, environment: intent.environment)
            } catch {
                return makeOutcome(item, intent: intent, status: .failed, reason: "ClientSetup: \(error)", attempts: attempts)
            }
            let result: APNsResult
            do {
                let sentAt = ContinuousClock.now
                result = try await client.send(notification)
                let took = ContinuousClock.now - sentAt
                RelayMetrics.apnsLatency.recordNanoseconds(took.totalNanoseconds)
                attempts += result.attempts
            } catch APNsError.invalidNotification(let invalid) {
                return makeOutcome(item, intent: intent, status: .rejected, reason: invalid.code.rawValue, attempts: attempts)
            } catch {
                // Queue full or shutting down: nothing was sent; wait and try again.
                lastReason = "\(error)"
                if await !sleepBeforeRetry(&retry, intent: intent, deadline: retryDeadline) {
                    return timeoutOutcome(item, intent: intent, attempts: attempts, reason: lastReason, deadline: retryDeadline)
                }
                continue
            }
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            switch result.classification {
            case .delivered:
                clearCredentialFault(teamID: teamID)
                return makeOutcome(item, intent: intent, status: .delivered, result: result, attempts: attempts)
            case .rejected:
                return makeOutcome(item, intent: intent, status: .rejected, result: result, attempts: attempts)
            case .unregistered:
                return makeOutcome(item, intent: intent, status: .unregistered, result: result, attempts: attempts)
            case .credentialFault:
                recordCredentialFault(teamID: teamID, reason: reason ?? "CredentialFault", now: clock())
                return makeOutcome(item, intent: intent, status: .failed, result: result, attempts: attempts)
            case .retryable:
                lastReason = reason
                if intent.expiration == 0 {
                    // Now or never: one try.
                    return makeOutcome(item, intent: intent, status: .expired, result: result, attempts: attempts)
                }
                logger.debug("retrying", metadata: metadata.merging(["apns.reason": "\(reason ?? "none")"]) { $1 })
                RelayMetrics.retries.increment()
                if await !sleepBeforeRetry(&retry, intent: intent, deadline: retryDeadline) {
                    var outcome = timeoutOutcome(item, intent: intent, attempts: attempts, reason: lastReason, deadline: retryDeadline)
                    outcome.httpStatus = result.status
                    outcome.apnsID = result.apnsID
                    return outcome
                }
            }
        }
    }

    /// Waits the next backoff; false when that would pass the intent's expiration or the retry
    /// deadline.
    private func sleepBeforeRetry(_ retry: inout Int, intent: Intent, deadline: Int64) async -> Bool {
        let delay = backoff.delay(attempt: retry)
        retry += 1
        let resumeAt = clock() + delay.components.seconds
        if resumeAt > deadline || resumeAt > intent.expiration { return false }
        do {
            try await Task.sleep(for: delay)
        } catch {
            return false
        }
        return true
    }

    private func timeoutOutcome(_ item: WorkItem, intent: Intent, attempts: Int, reason: String?, deadline: Int64) -> Outcome {
        let expired = intent.expiration <= deadline
        return makeOutcome(item, intent: intent, status: expired ? .expired : .failed,
                           reason: expired ? (reason ?? "Expired") : "RetryDeadline: \(reason ?? "no answer")", attempts: attempts)
    }

    private func client(credentialIndex: Int, environment: APNsEnvironment) throws -> APNsClient {
        let endpoint: APNsEndpoint
        switch configuration.apns.endpoint {
        case "production": endpoint = environment == .production ? .production : .development
        default: endpoint = try APNsEndpoint(parsing: configuration.apns.endpoint)
        }
        let key = "\(credentialIndex)|\(endpoint)"
        return try clients.withLock { clients in
            if let existing = clients[key] { return existing }
            var settings = APNsClientConfiguration(endpoint: endpoint, credential: .token(tokenSources[credentialIndex]))
            settings.connections = configuration.apns.connections
            settings.insecureSkipVerify = configuration.apns.insecureSkipVerify
            settings.requestTimeout = .seconds(Int64(configuration.apns.requestTimeoutSeconds))
            settings.maxQueuedNotifications = max(configuration.limits.maxInFlight, 1000)
            let client = try APNsClient(configuration: settings, logger: logger)
            clients[key] = client
            return client
        }
    }

    // MARK: Credential faults

    private func activeCredentialFault(teamID: String, now: Int64) -> String? {
        state.withLock { state in
            guard let fault = state.disabledTeams[teamID] else { return nil }
            if now >= fault.until {
                // Let this one intent probe; the next ones wait for its answer's cool-down.
                state.disabledTeams[teamID] = (now + configuration.retry.credentialFaultCooldownSeconds, fault.reason)
                return nil
            }
            return "CredentialFault: \(fault.reason)"
        }
    }

    private func recordCredentialFault(teamID: String, reason: String, now: Int64) {
        let isNew = state.withLock { state in
            defer { state.disabledTeams[teamID] = (now + configuration.retry.credentialFaultCooldownSeconds, reason) }
            return state.disabledTeams[teamID] == nil
        }
        RelayMetrics.credentialFault(teamID: teamID)
        if isNew {
            logger.critical("APNs refused the credentials: sends for this team stop", metadata: [
                "apns.team_id": "\(teamID)", "apns.reason": "\(reason)",
                "relay.cooldown_s": "\(configuration.retry.credentialFaultCooldownSeconds)",
            ])
        }
    }

    private func clearCredentialFault(teamID: String) {
        let cleared = state.withLock { $0.disabledTeams.removeValue(forKey: teamID) != nil }
        if cleared { logger.warning("APNs accepts the credentials again", metadata: ["apns.team_id": "\(teamID)"]) }
    }

    // MARK: Outcomes and offsets

    private func makeOutcome(_ item: WorkItem, intent: Intent, status: Outcome.Status, result: APNsResult? = nil,
                             reason: String? = nil, attempts: Int = 0) -> Outcome {
        var outcome = makeOutcome(item, id: intent.id, token: intent.token, topic: intent.topic, status: status,
                                  reason: reason ?? result?.reason?.description ?? result?.failure.map { "\($0)" })
        outcome.httpStatus = result?.status
        outcome.apnsID = result?.apnsID ?? APNsIdentifiers.format(Intent.apnsID(for: intent.id))
        outcome.unregisteredAt = status == .unregistered ? result?.timestamp : nil
        outcome.attempts = attempts
        return outcome
    }

    private func makeOutcome(_ item: WorkItem, id: String?, token: String?, topic: String?, status: Outcome.Status,
                             reason: String?) -> Outcome {
        let elapsed = ContinuousClock.now - item.consumedAt
        return Outcome(id: id, token: token, topic: topic, status: status, reason: reason, attempts: 0,
                       latencyMilliseconds: elapsed.totalMilliseconds,
                       partition: item.partition.partition, offset: item.offset, worker: worker,
                       at: APNsIdentifiers.epochMilliseconds())
    }

    /// Publishes until the delivery report succeeds (retrying with backoff), then finishes the
    /// item. If the partition is revoked meanwhile the offset is not stored.
    private func publish(_ outcome: Outcome, _ item: WorkItem, metadata: Logger.Metadata) async {
        let value = outcome.utf8
        let key = outcome.token.map { Array($0.utf8) }
        var retry = 0
        while true {
            do {
                _ = try await producer.send(topic: configuration.kafka.outcomesTopic, key: key, value: value)
                break
            } catch {
                logger.warning("outcome not published yet", metadata: metadata.merging(["kafka.error": "\(error)"]) { $1 })
                if !isCurrent(item) {
                    finish(item, stored: false)
                    return
                }
                try? await Task.sleep(for: backoff.delay(attempt: retry))
                retry += 1
            }
        }
        state.withLock { $0.outcomeCounts[outcome.status.rawValue, default: 0] += 1 }
        RelayMetrics.outcome(outcome)
        finish(item, stored: true)
    }

    private func finish(_ item: WorkItem, stored: Bool) {
        let (committable, waiters, inFlight) = state.withLock { state -> (Int64?, [CheckedContinuation<Void, Never>], Int) in
            state.inFlight -= 1
            var committable: Int64?
            if stored, state.generations[item.partition] == item.generation, state.trackers[item.partition] != nil {
                committable = state.trackers[item.partition]!.finish(item.offset)
            }
            var waiters: [CheckedContinuation<Void, Never>] = []
            if state.inFlight < configuration.limits.maxInFlight, let waiter = state.capacityWaiter {
                state.capacityWaiter = nil
                waiters.append(waiter)
            }
            if state.inFlight == 0, let waiter = state.drainedWaiter {
                state.drainedWaiter = nil
                waiters.append(waiter)
            }
            return (committable, waiters, state.inFlight)
        }
        if let committable {
            do {
                try consumer.storeOffset(item.partition, offset: committable)
            } catch {
                logger.info("offset not stored (partition no longer ours)", metadata: [
                    "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(committable)",
                ])
            }
        }
        RelayMetrics.inFlight.record(inFlight)
        for waiter in waiters { waiter.resume() }
    }

    /// Waits for in-flight work to end, up to the shutdown deadline.
    private func drain() async {
        let deadline = Duration.seconds(configuration.shutdownDeadlineSeconds)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let done = self.state.withLock { state -> Bool in
                        if state.inFlight == 0 { return true }
                        state.drainedWaiter = continuation
                        return false
                    }
                    if done { continuation.resume() }
                }
            }
            group.addTask { try? await Task.sleep(for: deadline) }
            await group.next()
            group.cancelAll()
            // Release the drain waiter if the deadline won.
            let waiter = self.state.withLock { state in
                defer { state.drainedWaiter = nil }
                return state.drainedWaiter
            }
            waiter?.resume()
        }
        let left = inFlight
        if left > 0 {
            logger.warning("shutdown deadline passed with intents in flight; their offsets stay uncommitted",
                           metadata: ["relay.in_flight": "\(left)"])
        }
    }
}
