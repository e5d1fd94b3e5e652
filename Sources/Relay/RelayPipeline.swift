import Common
public import APNs
import Foundation
import Kafka
public import Logging
import NIOCore
import Redis
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
    /// Provider tokens per credential: shared by the fleet through Redis when it is configured.
    private let tokenSources: [any ProviderTokenSource]
    /// APNs clients by credential and endpoint, opened on first use.
    private let clients: Mutex<[ClientKey: APNsClient]>
    private let endpoints: [APNsEnvironment: Result<APNsEndpoint, APNsError>]
    private let state = Mutex(State())
    private let logger: Logger
    private let clock: @Sendable () -> Int64
    private let backoff: Backoff
    private let stopRequested = Mutex(false)
    private let published: (@Sendable (Outcome) -> Void)?
    /// Nil without Redis (`redis.url` empty); the policy, badges and the fleet's tokens share it.
    private let redis: RedisClient?
    private let deduplicator: Deduplicator?
    private let policy: DevicePolicy?
    private let badges: BadgeStore?

    struct State {
        var trackers: [TopicPartition: OffsetTracker] = [:]
        /// Bumped when a partition is revoked: work from an older generation is abandoned.
        var generations: [TopicPartition: Int] = [:]
        /// Per device token, its items that are sent or parked, in order: the first is under
        /// way, the others wait for it.
        var devices: [String: CircularBuffer<WorkItem>] = [:]
        var inFlight = 0
        var capacityWaiter: CheckedContinuation<Void, Never>?
        var drainedWaiter: CheckedContinuation<Void, Never>?
        var disabledTeams: [String: (until: Int64, reason: String)] = [:]
        var outcomeCounts: [String: Int] = [:]
        var publishFailures = 0
        var firstConsumedAt: ContinuousClock.Instant?
        /// Why Redis is failing, while it is.
        var redisTrouble: String?
        /// Due-index members taken from a mailbox and in flight here.
        var mailboxJobs: Set<String> = []
    }

    /// What the policy decided for a consumed intent before it reaches its device's queue.
    enum Admission: Sendable {
        case send
        /// APNs answered it before, or a copy is in flight here: outcome `duplicate`.
        case duplicate
        /// A newer intent of the batch or the mailbox takes its place: outcome `coalesced`.
        case coalesced(by: String)
        /// It sits in its mailbox already (a redelivery): no outcome now, its offset moves on.
        case inMailbox
        /// The device may not be sent to now and the intent is now-or-never: outcome `expired`.
        case nowOrNever
        /// The device may not be sent to before `due`: park it in the device's mailbox.
        case park(due: Int64)
        /// Taken from a mailbox after its expiration passed: outcome `expired`.
        case expiredParked
    }

    /// One consumed message (or one intent taken from a mailbox) on its way to an outcome; a
    /// class, so the async frames on the way hold one reference instead of the intent.
    final class WorkItem: Sendable {
        let partition: TopicPartition
        let offset: Int64
        let generation: Int
        let consumedAt: ContinuousClock.Instant
        let intent: Result<Intent, InvalidIntent>
        let admission: Admission
        /// APNs' answer to it is recorded for dedupe (a usable intent to send, with Redis);
        /// among the items in flight, only one per (token, topic, id) does.
        let recordsAnswer: Bool
        /// Taken from a mailbox: its due-index member (its offset was committed when it was
        /// parked, so this item stores none).
        let mailboxMember: String?

        init(partition: TopicPartition, offset: Int64, generation: Int, consumedAt: ContinuousClock.Instant,
             intent: Result<Intent, InvalidIntent>, admission: Admission = .send, recordsAnswer: Bool = false,
             mailboxMember: String? = nil) {
            self.partition = partition
            self.offset = offset
            self.generation = generation
            self.consumedAt = consumedAt
            self.intent = intent
            self.admission = admission
            self.recordsAnswer = recordsAnswer
            self.mailboxMember = mailboxMember
        }

        /// The device whose queue this item waits in: items that are sent or parked.
        var queueToken: String? {
            guard case .success(let intent) = intent else { return nil }
            switch admission {
            case .send, .park: return intent.token
            default: return nil
            }
        }
    }

    /// - Parameters:
    ///   - clock: epoch seconds (tests inject one).
    ///   - published: called with every outcome once its delivery report succeeded (benchmarks).
    public init(configuration: RelayConfiguration, worker: String? = nil,
                logger: Logger = Logger(label: "apns-relay"),
                clock: @escaping @Sendable () -> Int64 = LocalProviderTokenSource.systemClock,
                published: (@Sendable (Outcome) -> Void)? = nil) throws {
        self.configuration = configuration
        self.worker = worker ?? "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
        self.logger = logger
        self.clock = clock
        self.published = published
        self.backoff = Backoff(base: .milliseconds(configuration.retry.initialBackoffMilliseconds),
                               maximum: .milliseconds(configuration.retry.maxBackoffMilliseconds))
        self.credentials = CredentialDirectory(configuration.apns.credentials)
        var redis: RedisClient?
        if !configuration.redis.url.isEmpty {
            var settings = RedisConfiguration(url: try RedisURL(parsing: configuration.redis.url))
            settings.connections = configuration.redis.connections
            settings.commandTimeout = .milliseconds(configuration.redis.timeoutMilliseconds)
            redis = try RedisClient(configuration: settings, logger: logger)
        }
        self.redis = redis
        self.deduplicator = redis.map { Deduplicator(client: $0) }
        self.policy = redis.map {
            var policy = DevicePolicy(client: $0, intentsTopic: configuration.kafka.intentsTopic,
                                      backoffBaseMilliseconds: configuration.policy.backoffInitialSeconds * 1000,
                                      backoffMaximumMilliseconds: configuration.policy.backoffMaxSeconds * 1000)
            policy.bucketWriteFailed = { [logger] error in
                RelayMetrics.redisErrors.increment()
                logger.warning("bucket write failed: that batch's sends are not counted", metadata: ["redis.error": "\(error)"])
            }
            return policy
        }
        self.badges = redis.map { BadgeStore(client: $0, appliedTTL: configuration.policy.longestDedupeWindowSeconds) }
        RelayMetrics.register(teamIDs: configuration.apns.credentials.map(\.teamID))
        self.tokenSources = try configuration.apns.credentials.map { credential -> any ProviderTokenSource in
            let signer = try ProviderTokenSigner(teamID: credential.teamID, keyID: credential.keyID, keyFile: credential.keyFile)
            signer.registerMetrics()
            if let redis { return try RedisProviderTokenSource(signer: signer, redis: redis, clock: clock, logger: logger) }
            return try LocalProviderTokenSource(signer: signer, clock: clock)
        }
        self.clients = Mutex([:])
        self.endpoints = Self.endpoints(configuration.apns.endpoint)
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
    /// Outcome deliveries Kafka has failed so far (each is retried until it is delivered).
    public var publishFailures: Int { state.withLock { $0.publishFailures } }

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
        if let trouble = state.withLock({ $0.redisTrouble }) {
            return configuration.redis.failOpen ? "Redis unreachable (sending without policy): \(trouble)" : "Redis unreachable (not consuming): \(trouble)"
        }
        let clients = clients.withLock { Array($0) }
        for (key, client) in clients where client.readyConnections == 0 {
            return "no ready APNs connection for \(key.endpoint)"
        }
        return nil
    }

    /// Settings that weaken the relay: shown on `/readyz` (and logged at start-up by `run`).
    public var warnings: [String] {
        configuration.apns.insecureSkipVerify ? ["apns.insecure_skip_verify is on: APNs' TLS certificate is not verified"] : []
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
        let mailboxes = Task { await deliverMailboxes() }
        // Lag from librdkafka's cached positions and watermarks (no round trip), every second.
        var lastLagReport = ContinuousClock.now
        while !stopRequested.withLock({ $0 }) && !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(100))
            if ContinuousClock.now - lastLagReport >= .seconds(1) {
                lastLagReport = .now
                for (partition, records) in consumer.lag {
                    RelayMetrics.consumerLag(partition: partition.partition, records: records)
                }
            }
        }
        consuming.cancel()
        mailboxes.cancel()
        await consuming.value
        await mailboxes.value
        await drain()
        _ = await producer.flush(timeout: .seconds(10))
        await consumer.close()
        await producer.close()
        for client in clients.withLock({ Array($0.values) }) { await client.shutdown() }
        await redis?.shutdown()
        logger.info("relay stopped", metadata: ["relay.outcomes": "\(outcomeCounts)"])
    }

    // MARK: Consuming

    /// What consuming hands to admitting, in consumption order: batches, parsed and grouped for
    /// their admission, and rebalances (so they apply between the right batches).
    private enum Consumed: Sendable {
        case batch([KafkaMessage], [Result<Intent, InvalidIntent>], Admitting)
        case assigned([TopicPartition])
        case revoked([TopicPartition])
    }

    /// Batches parsed and grouped ahead of the admitting task.
    private static let admissionsUnderWay = 2

    /// Reads the consumer's events; each batch is parsed and grouped for its admission while
    /// the admitting task admits earlier ones, in order (each batch's reads go to Redis after
    /// the bucket writes of the batch before it).
    private func consume() async {
        // Without Redis admitting takes no round trip: hand over one batch at a time (fewer
        // consumed messages held).
        let handOver = HandOver<Consumed>(capacity: policy == nil ? 1 : Self.admissionsUnderWay)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.admitConsumed(handOver) }
            events: for await event in consumer.events {
                let consumed: Consumed
                switch event {
                case .assigned(let partitions): consumed = .assigned(partitions)
                case .revoked(let partitions): consumed = .revoked(partitions)
                case .messages(let batch):
                    let parsed = batch.map(parse)
                    consumed = .batch(batch, parsed, startAdmission(parsed))
                case .error(let error):
                    logger.warning("consumer error", metadata: ["kafka.error": "\(error)"])
                    continue
                }
                guard await handOver.push(consumed), !Task.isCancelled else { break events }
            }
            handOver.finish()
        }
    }

    private func admitConsumed(_ handOver: HandOver<Consumed>) async {
        while let next = await handOver.pop() {
            switch next {
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
            case .batch(let batch, let parsed, let admitting):
                guard let admissions = await finishAdmission(parsed, admitting) else { return }
                for (index, message) in batch.enumerated() {
                    await waitForCapacity()
                    if Task.isCancelled { return }
                    admit(message, parsed[index], admissions[index])
                }
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

    private func parse(_ message: KafkaMessage) -> Result<Intent, InvalidIntent> {
        do {
            return .success(try Intent.parse(message.value, key: message.key, now: clock(),
                                             defaultTTL: configuration.defaults.expirationSeconds))
        } catch {
            return .failure(error)
        }
    }

    /// A batch's admission: what was decided without Redis, and what to ask Redis.
    private struct Admitting: Sendable {
        var admissions: [Admission]
        /// For each group of the round trip, the batch positions of its intents.
        var members: [[Int]]
        var pending: DevicePolicy.PendingAdmission?
    }

    /// Starts deciding what the policy says for each message of a batch (invalid ones: `.send`,
    /// they never get that far): collapses intents with the same (token, topic, collapse id) to
    /// the newest where the topic coalesces, and groups the rest by device and topic for the
    /// question to Redis (asked by ``finishAdmission(_:_:)``, one batch after another).
    private func startAdmission(_ parsed: [Result<Intent, InvalidIntent>]) -> Admitting {
        var admitting = Admitting(admissions: Array(repeating: .send, count: parsed.count), members: [])
        guard let policy else { return admitting }
        var groups: [DevicePolicy.Group] = []
        Self.group(parsed, rules: configuration.policy.rules(for:), admissions: &admitting.admissions, groups: &groups,
                   members: &admitting.members)
        if !groups.isEmpty { admitting.pending = policy.admission(groups) }
        return admitting
    }

    /// Waits for a batch's admission. While Redis fails this asks again with backoff (admitting
    /// stops, the consumer's buffer fills and its partitions pause), or with `redis.fail_open`
    /// lets everything through. Nil when cancelled meanwhile.
    private func finishAdmission(_ parsed: [Result<Intent, InvalidIntent>], _ admitting: Admitting) async -> [Admission]? {
        var admissions = admitting.admissions
        guard let pending = admitting.pending else { return admissions }
        var attempt = 0
        while true {
            do {
                let asked = ContinuousClock.now
                let answers = try await pending.get(now: nowMilliseconds())
                RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - asked).totalNanoseconds)
                redisRecovered()
                for (index, answer) in answers.enumerated() {
                    Self.apply(answer, to: admitting.members[index], parsed, &admissions)
                }
                return admissions
            } catch {
                redisFailed(error)
                if configuration.redis.failOpen { return admissions }
                if Task.isCancelled { return nil }
                try? await Task.sleep(for: backoff.delay(attempt: attempt))
                attempt += 1
            }
        }
    }

    /// Now in epoch milliseconds, for the policy's clocks: the system's milliseconds, or the
    /// injected seconds clock when it disagrees with the system (tests moving time).
    private func nowMilliseconds() -> Int64 {
        let milliseconds = APNsIdentifiers.epochMilliseconds()
        let seconds = clock()
        return abs(milliseconds / 1000 - seconds) <= 1 ? milliseconds : seconds * 1000
    }

    /// Collapses in-batch duplicates of a collapse id (the older ones are `coalesced` by the
    /// newest) and groups the other usable intents by device and topic, in batch order.
    private static func group(_ parsed: [Result<Intent, InvalidIntent>], rules: (String) -> RelayConfiguration.Policy.Rules,
                              admissions: inout [Admission], groups: inout [DevicePolicy.Group], members: inout [[Int]]) {
        struct CollapseKey: Hashable { var token: String, topic: String, collapseID: String }
        var newest: [CollapseKey: Int] = [:]
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry, let collapseID = intent.collapseID, rules(intent.topic).coalesce else { continue }
            newest[CollapseKey(token: intent.token, topic: intent.topic, collapseID: collapseID)] = index
        }
        struct GroupKey: Hashable { var token: String, topic: String }
        var groupIndex: [GroupKey: Int] = [:]
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry else { continue }
            if let collapseID = intent.collapseID,
               let last = newest[CollapseKey(token: intent.token, topic: intent.topic, collapseID: collapseID)], last != index,
               case .success(let newer) = parsed[last] {
                admissions[index] = .coalesced(by: newer.id)
                continue
            }
            let key = GroupKey(token: intent.token, topic: intent.topic)
            if let existing = groupIndex[key] {
                groups[existing].ids.append(intent.id)
                members[existing].append(index)
            } else {
                groupIndex[key] = groups.count
                groups.append(DevicePolicy.Group(token: intent.token, topic: intent.topic, ids: [intent.id], rules: rules(intent.topic)))
                members.append([index])
            }
        }
    }

    /// Turns one group's answer into admissions: of the intents that must wait, the newest is
    /// parked and the older ones are `coalesced` by it (now-or-never ones expire instead).
    private static func apply(_ answer: (decisions: [DevicePolicy.Admission], due: Int64), to positions: [Int],
                              _ parsed: [Result<Intent, InvalidIntent>], _ admissions: inout [Admission]) {
        var parking: Int?
        for (position, decision) in zip(positions, answer.decisions).reversed() {
            guard case .success(let intent) = parsed[position] else { continue }
            switch decision {
            case .send: admissions[position] = .send
            case .duplicate: admissions[position] = .duplicate
            case .inMailbox: admissions[position] = .inMailbox
            case .wait:
                if intent.expiration == 0 {
                    admissions[position] = .nowOrNever
                } else if let parking, case .success(let newer) = parsed[parking] {
                    // A copy of the intent being parked is that intent: a duplicate.
                    admissions[position] = newer.id == intent.id ? .duplicate : .coalesced(by: newer.id)
                } else {
                    admissions[position] = .park(due: answer.due)
                    parking = position
                }
            }
        }
    }

    private func redisFailed(_ error: RedisError) {
        let isNew = state.withLock { state in
            defer { state.redisTrouble = "\(error)" }
            return state.redisTrouble == nil
        }
        RelayMetrics.redisErrors.increment()
        if isNew {
            logger.error("Redis is failing", metadata: [
                "redis.error": "\(error)", "redis.fail_open": "\(configuration.redis.failOpen)",
            ])
        }
    }

    private func redisRecovered() {
        let wasDown = state.withLock { state in
            defer { state.redisTrouble = nil }
            return state.redisTrouble != nil
        }
        if wasDown { logger.warning("Redis answers again") }
    }

    private func admit(_ message: KafkaMessage, _ parsed: Result<Intent, InvalidIntent>, _ admission: Admission) {
        let partition = message.topicPartition
        let (start, inFlight) = state.withLock { state -> (WorkItem?, Int) in
            guard state.trackers[partition] != nil, let generation = state.generations[partition] else {
                return (nil, state.inFlight)
            }
            if state.firstConsumedAt == nil { state.firstConsumedAt = .now }
            state.trackers[partition]!.started(message.offset)
            state.inFlight += 1
            guard case .success(let intent) = parsed else {
                return (WorkItem(partition: partition, offset: message.offset, generation: generation,
                                 consumedAt: .now, intent: parsed), state.inFlight)
            }
            var admission = admission
            var recordsAnswer = false
            if deduplicator != nil, case .send = admission {
                // A copy in flight here is in its device's queue (Redis learns of it only once
                // APNs answered it).
                if Self.isInFlight(intent, state.devices[intent.token]) {
                    admission = .duplicate
                } else {
                    recordsAnswer = true
                }
            }
            let item = WorkItem(partition: partition, offset: message.offset, generation: generation,
                                consumedAt: .now, intent: parsed, admission: admission, recordsAnswer: recordsAnswer)
            return (Self.enqueue(item, &state), state.inFlight)
        }
        RelayMetrics.intentsConsumed.increment()
        RelayMetrics.inFlight.record(inFlight)
        guard let start else { return }
        Task { await self.work(start) }
    }

    /// Whether an item in the device's queue records its answer for the same intent.
    private static func isInFlight(_ intent: Intent, _ queue: CircularBuffer<WorkItem>?) -> Bool {
        guard let queue else { return false }
        return queue.contains { item in
            guard item.recordsAnswer, case .success(let other) = item.intent else { return false }
            return other.id == intent.id && other.topic == intent.topic
        }
    }

    /// Queues an item behind its device's earlier ones; returns it when it can start now.
    private static func enqueue(_ item: WorkItem, _ state: inout State) -> WorkItem? {
        guard let token = item.queueToken else { return item }
        if state.devices[token] != nil {
            state.devices[token]!.append(item)
            return nil
        }
        var queue = CircularBuffer<WorkItem>(initialCapacity: 4)
        queue.append(item)
        state.devices[token] = queue
        return item
    }

    /// Runs one item, then the items queued behind it for the same device, in order.
    private func work(_ first: WorkItem) async {
        var next: WorkItem? = first
        while let item = next {
            await handle(item)
            guard let token = item.queueToken else { return }
            next = state.withLock { state in
                state.devices[token]?.removeFirst()
                if let queued = state.devices[token]?.first { return queued }
                state.devices[token] = nil
                return nil
            }
        }
    }

    /// One intent from consume to outcome. Async functions on this path keep their frames small
    /// (the decisions live in synchronous helpers that are not inlined into them): each frame is
    /// held by every intent in flight.
    @inline(never)
    private func handle(_ item: WorkItem) async {
        let ending: Ending
        if case .park(let due) = item.admission, await park(item, due: due) {
            ending = Ending(parked: true)
        } else if let delivery = prepare(item) {
            await send(delivery)
            ending = delivery.ending
        } else {
            ending = await earlyEnding(item)
        }
        await conclude(item, ending)
    }

    /// How an item ended: its outcome (nil when its work was abandoned, its partition revoked)
    /// and, when APNs accepted it, the device's last-notification record. A class, so the async
    /// frames on the way hold a reference, not the outcome.
    private final class Ending {
        var outcome: Outcome?
        var lastSent: DeviceRecords.LastSent?
        /// In its device's mailbox: no outcome now (the mailbox answers it later), and its
        /// offset may be committed.
        var parked: Bool

        init(outcome: Outcome? = nil, parked: Bool = false) {
            self.outcome = outcome
            self.parked = parked
        }
    }

    /// Badge change (if any), then delivery.
    @inline(never)
    private func send(_ delivery: Delivery) async {
        if delivery.intent.badge != nil, await !applyBadge(delivery) { return }
        await deliver(delivery)
        Self.settle(delivery)
    }

    /// Adds the badge sent to the outcome and notes the device's last notification.
    @inline(never)
    private static func settle(_ delivery: Delivery) {
        guard var outcome = delivery.ending.outcome else { return }
        outcome.badge = delivery.badge
        delivery.ending.outcome = outcome
        if outcome.status == .delivered {
            delivery.ending.lastSent = DeviceRecords.lastSent(delivery.intent, delivery.notification,
                                                              apnsID: outcome.apnsID, at: outcome.at)
        }
    }

    /// Records what needs recording, publishes the outcome and ends the item.
    @inline(never)
    private func conclude(_ item: WorkItem, _ ending: Ending) async {
        // The outcome stays in `ending` (this frame, held by every intent in flight, stays small).
        guard let status = ending.outcome?.status else {
            finish(item, stored: ending.parked)
            return
        }
        guard await recordAndPublish(item, ending, records: item.recordsAnswer && Self.isAnswered(status)) else {
            finish(item, stored: false)
            return
        }
        if let member = item.mailboxMember { await release(member, item) }
        finish(item, stored: true)
    }

    /// Records the answer first when `records`, then publishes the outcome. False when the
    /// item's partition was revoked before the outcome was out.
    @inline(never)
    private func recordAndPublish(_ item: WorkItem, _ ending: Ending, records: Bool) async -> Bool {
        if records {
            // Usually one wait for both: the record's round trip, then the outcome's report.
            switch await recordThenPublish(item, ending) {
            case .published:
                published(ending)
                return true
            case .notRecorded:
                await record(item, ending)
            case .notPublished(let error):
                publishFailed(item, error)
            }
        }
        return await publish(ending, item)
    }

    /// Statuses that mean APNs gave a final answer: those are recorded for dedupe.
    private static func isAnswered(_ status: Outcome.Status) -> Bool {
        status == .delivered || status == .rejected || status == .unregistered
    }

    private enum Chained {
        case published
        /// Redis failed the record (reported here): record with retries, then publish.
        case notRecorded
        /// Recorded, but the outcome's delivery failed: publish with retries.
        case notPublished(KafkaError)
    }

    /// Records the answered intent and, once Redis has it, hands its outcome to the producer
    /// from the recording task, so the item waits once for both.
    @inline(never)
    private func recordThenPublish(_ item: WorkItem, _ ending: Ending) async -> Chained {
        guard let deduplicator, case .success(let intent) = item.intent, let (status, window) = recordFields(ending),
              let (key, value) = Self.encoded(ending) else { return .notRecorded }
        let producer = self.producer, outcomesTopic = configuration.kafka.outcomesTopic, started = ContinuousClock.now
        let chained = await withCheckedContinuation { (continuation: CheckedContinuation<Result<Chained, RedisError>, Never>) in
            deduplicator.record(token: intent.token, topic: intent.topic, id: intent.id, status: status, window: window,
                                lastSent: ending.lastSent) { recorded in
                if case .failure(let error) = recorded { return continuation.resume(returning: .failure(error)) }
                RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - started).totalNanoseconds)
                producer.send(topic: outcomesTopic, key: key, value: value) { delivered in
                    if case .failure(let error) = delivered { return continuation.resume(returning: .success(.notPublished(error))) }
                    continuation.resume(returning: .success(.published))
                }
            }
        }
        switch chained {
        case .success(let result): return result
        case .failure(let error):
            redisFailed(error)
            return .notRecorded
        }
    }

    /// Records the answered intent in Redis before its outcome is published (so a redelivery
    /// of it is a duplicate). Retries while Redis fails, unless `redis.fail_open`.
    @inline(never)
    private func record(_ item: WorkItem, _ ending: Ending) async {
        guard let deduplicator, case .success(let intent) = item.intent, let (status, window) = recordFields(ending) else { return }
        _ = await withRedisRetries(item) { () throws(RedisError) in
            try await deduplicator.record(token: intent.token, topic: intent.topic, id: intent.id, status: status, window: window,
                                          lastSent: ending.lastSent)
        }
    }

    /// The status to record and for how long (kept out of `record`'s frame).
    @inline(never)
    private func recordFields(_ ending: Ending) -> (String, Int64)? {
        guard let outcome = ending.outcome else { return nil }
        return (outcome.status.rawValue, configuration.policy.rules(for: outcome.topic ?? "").dedupeWindowSeconds)
    }

    private static let refusalsBeforeGivingUp = 3

    /// Runs `body` until it succeeds. While Redis fails: retries with backoff as long as the
    /// item's partition is still ours, or with `redis.fail_open` gives up at once. A command
    /// Redis refuses (``RedisError/isRefusal``) is asked again only twice. Nil when it gave up.
    private func withRedisRetries<T>(_ item: WorkItem, _ body: () async throws(RedisError) -> T) async -> T? {
        var attempt = 0, refusals = 0
        while true {
            do {
                let started = ContinuousClock.now
                let result = try await body()
                RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - started).totalNanoseconds)
                if attempt > 0 { redisRecovered() }
                return result
            } catch {
                if error.isRefusal {
                    // Not an outage: Redis refuses this item's command for what its keys hold.
                    // It goes on as with `redis.fail_open`, alone.
                    refusals += 1
                    if refusals == Self.refusalsBeforeGivingUp {
                        RelayMetrics.redisErrors.increment()
                        logger.error("Redis refuses this intent's command: it goes on without the policy",
                                     metadata: metadata(item, ["redis.error": "\(error)"]))
                        return nil
                    }
                } else {
                    redisFailed(error)
                }
                if configuration.redis.failOpen || !isCurrent(item) || Task.isCancelled { return nil }
                try? await Task.sleep(for: backoff.delay(attempt: attempt))
                attempt += 1
            }
        }
    }

    // MARK: Mailboxes

    /// Parks the item's intent in its device's mailbox (the intent it displaces there comes out
    /// `coalesced`). False when it could not (Redis failing with `redis.fail_open`, or the
    /// partition was revoked meanwhile: then the intent is sent, or abandoned, as usual).
    @inline(never)
    private func park(_ item: WorkItem, due: Int64, tooManyRequests: Bool = false) async -> Bool {
        guard let policy, case .success(let intent) = item.intent, isCurrent(item) else { return false }
        let entry = DevicePolicy.Entry(partition: item.partition.partition, offset: item.offset,
                                       consumedAt: APNsIdentifiers.epochMilliseconds() - (ContinuousClock.now - item.consumedAt).totalMilliseconds,
                                       expiration: intent.expiration, message: intent.encoded)
        let now = nowMilliseconds()
        guard let parked = await withRedisRetries(item, { () throws(RedisError) in
            try await policy.park(token: intent.token, topic: intent.topic, id: intent.id, entry: entry,
                                  due: max(due, now), now: now, tooManyRequests: tooManyRequests)
        }) else { return false }
        RelayMetrics.parked.increment()
        logger.debug("parked", metadata: metadata(item, ["relay.due_ms": "\(parked.due - now)"]))
        if let displaced = parked.displaced {
            await publishDisplaced(displaced, by: intent.id, item)
        }
        return true
    }

    /// Publishes `coalesced` for an intent a newer one displaced from its mailbox.
    @inline(never)
    private func publishDisplaced(_ entry: DevicePolicy.Entry, by newer: String, _ item: WorkItem) async {
        let displaced = mailboxItem(entry, token: nil, member: nil, generation: item.generation)
        var outcome = earlyOutcome(displaced, .coalesced(by: newer))
        outcome.supersededBy = newer
        _ = await publish(Ending(outcome: outcome), item)
    }

    /// A work item for an intent kept in a mailbox (its offset is not stored again).
    private func mailboxItem(_ entry: DevicePolicy.Entry, token: String?, member: String?, generation: Int,
                             admission: Admission = .send) -> WorkItem {
        let now = APNsIdentifiers.epochMilliseconds()
        var intent = Result { () throws(InvalidIntent) in
            try Intent.parse(entry.message, key: token.map { Array($0.utf8) }, now: clock(), defaultTTL: configuration.defaults.expirationSeconds)
        }
        if case .success(var parsed) = intent {
            parsed.expiration = entry.expiration
            intent = .success(parsed)
        }
        let partition = TopicPartition(topic: configuration.kafka.intentsTopic, partition: entry.partition)
        var recordsAnswer = false
        if case .success = intent, case .send = admission { recordsAnswer = true }
        return WorkItem(partition: partition, offset: entry.offset, generation: generation,
                        consumedAt: .now - .milliseconds(max(now - entry.consumedAt, 0)),
                        intent: intent, admission: admission, recordsAnswer: recordsAnswer, mailboxMember: member)
    }

    /// Ends a mailbox claim once its outcome is out (a failure only means the claim's lease
    /// runs out and the entry is taken again, then answered `duplicate`).
    private func release(_ member: String, _ item: WorkItem) async {
        guard let policy, let parts = DevicePolicy.parseMember(member) else { return }
        do throws(RedisError) {
            try await policy.release(partition: item.partition.partition, token: parts.token, topic: parts.topic, id: parts.id)
        } catch {
            redisFailed(error)
        }
    }

    /// While running: every `policy.mailbox_poll_ms`, takes the mailbox entries that became due
    /// on the partitions this relay owns and sends them through their devices' queues.
    private func deliverMailboxes() async {
        guard let policy else { return }
        let interval = Duration.milliseconds(configuration.policy.mailboxPollMilliseconds)
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            if Task.isCancelled { return }
            await takeDueMailboxes(policy)
        }
    }

    @inline(never)
    private func takeDueMailboxes(_ policy: DevicePolicy) async {
        let (owned, room) = state.withLock { state in
            (state.trackers.keys.filter { $0.topic == configuration.kafka.intentsTopic }.map { ($0.partition, state.generations[$0] ?? 0) },
             configuration.limits.maxInFlight - state.inFlight)
        }
        guard !owned.isEmpty, room > 0 else { return }
        let generations = Dictionary(owned, uniquingKeysWith: { $1 })
        let now = nowMilliseconds()
        let due: [(partition: Int32, member: String)]
        do {
            due = try await policy.due(partitions: owned.map(\.0).sorted(), now: now, limit: min(room, 500))
        } catch {
            redisFailed(error)
            return
        }
        for (partition, member) in due {
            let claimed = state.withLock { $0.mailboxJobs.insert(member).inserted }
            guard claimed else { continue }
            guard let parts = DevicePolicy.parseMember(member) else {
                _ = try? await policy.reindex(partition: partition, member: member, due: nil)
                state.withLock { _ = $0.mailboxJobs.remove(member) }
                continue
            }
            let taken: DevicePolicy.Take
            do {
                taken = try await policy.take(partition: partition, token: parts.token, topic: parts.topic, id: parts.id,
                                              rules: configuration.policy.rules(for: parts.topic), now: nowMilliseconds())
            } catch {
                state.withLock { _ = $0.mailboxJobs.remove(member) }
                guard error.isRefusal else {
                    redisFailed(error)
                    return
                }
                // Not an outage: its index member already moved to the lease's end, so it is
                // asked again then; the other entries go on.
                RelayMetrics.redisErrors.increment()
                logger.error("Redis refuses taking a mailbox entry", metadata: ["relay.member": "\(member)", "redis.error": "\(error)"])
                continue
            }
            let generation = generations[partition] ?? 0
            let item: WorkItem
            switch taken {
            case .stale, .notYet:
                // Not yet: the member moves to its new due time; stale: it goes.
                let next: Int64? = if case .notYet(let next) = taken { next } else { nil }
                _ = try? await policy.reindex(partition: partition, member: member, due: next)
                state.withLock { _ = $0.mailboxJobs.remove(member) }
                continue
            case .answered(let entry):
                item = mailboxItem(entry, token: parts.token, member: member, generation: generation, admission: .duplicate)
            case .expired(let entry):
                item = mailboxItem(entry, token: parts.token, member: member, generation: generation, admission: .expiredParked)
            case .claimed(let entry):
                item = mailboxItem(entry, token: parts.token, member: member, generation: generation)
            }
            let start = state.withLock { state -> WorkItem? in
                state.inFlight += 1
                return Self.enqueue(item, &state)
            }
            if let start { Task { await self.work(start) } }
        }
    }

    /// Log metadata naming one intent.
    private func metadata(_ item: WorkItem, _ extra: Logger.Metadata = [:]) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(item.offset)",
        ]
        switch item.intent {
        case .success(let intent): metadata["intent.id"] = "\(intent.id)"
        case .failure(let invalid): metadata["intent.id"] = "\(invalid.id ?? "none")"
        }
        return metadata.merging(extra) { $1 }
    }

    /// The delivery of a usable intent that is to be sent; nil for the others (see
    /// ``earlyEnding(_:)``).
    @inline(never)
    private func prepare(_ item: WorkItem) -> Delivery? {
        guard case .success(let intent) = item.intent else { return nil }
        switch item.admission {
        case .send, .park: return Delivery(intent: intent, item: item, credentialIndex: credentials.index(forTopic: intent.topic))
        default: return nil
        }
    }

    /// How an intent that is not sent ends. A coalesced intent's badge change still counts
    /// (the newer notification shows the sum).
    @inline(never)
    private func earlyEnding(_ item: WorkItem) async -> Ending {
        if case .inMailbox = item.admission { return Ending(parked: true) }
        var outcome = earlyOutcome(item, item.admission)
        if case .coalesced = item.admission, case .success(let intent) = item.intent, let change = intent.badge, let badges {
            outcome.badge = await withRedisRetries(item) { () throws(RedisError) in
                try await badges.apply(change, intentID: intent.id, token: intent.token, topic: intent.topic)
            }
        }
        return Ending(outcome: outcome)
    }

    /// The outcome of an unusable message or of an intent the policy keeps from being sent.
    @inline(never)
    private func earlyOutcome(_ item: WorkItem, _ admission: Admission) -> Outcome {
        let intent: Intent
        switch item.intent {
        case .failure(let invalid): return invalidOutcome(item, invalid)
        case .success(let usable): intent = usable
        }
        switch admission {
        case .coalesced(let newer):
            var outcome = makeOutcome(item, intent: intent, status: .coalesced, reason: "Superseded")
            outcome.supersededBy = newer
            return outcome
        case .nowOrNever:
            return makeOutcome(item, intent: intent, status: .expired, reason: "RateLimited")
        case .expiredParked:
            return makeOutcome(item, intent: intent, status: .expired, reason: "ExpiredWhileParked")
        case .duplicate, .send, .park, .inMailbox:
            return makeOutcome(item, intent: intent, status: .duplicate, reason: "AlreadyAnswered")
        }
    }

    private func invalidOutcome(_ item: WorkItem, _ invalid: InvalidIntent) -> Outcome {
        logger.info("invalid intent", metadata: metadata(item, ["intent.reason": "\(invalid.reason)"]))
        return makeOutcome(item, id: invalid.id, token: invalid.token, topic: invalid.topic, status: .invalid,
                           reason: "\(invalid.reason): \(invalid.message)")
    }

    // MARK: Delivering

    private func isCurrent(_ item: WorkItem) -> Bool {
        state.withLock { $0.trackers[item.partition] != nil && $0.generations[item.partition] == item.generation }
    }

    /// One intent's delivery across its attempts.
    private final class Delivery {
        let intent: Intent
        let item: WorkItem
        var notification: APNsNotification
        /// The badge count written into the payload, for intents that change it.
        var badge: Int64?
        /// Which credentials send for the intent's topic (nil: none do).
        let credentialIndex: Int?
        let ending = Ending()

        /// Ends the delivery with this outcome (nil: abandoned).
        func finish(_ outcome: Outcome?) -> Step {
            ending.outcome = outcome
            return .finish
        }
        var retryDeadline: Int64 = 0
        var attempts = 0
        var retry = 0
        var lastReason: String?
        /// The last answer, for the outcome when retries run out.
        var lastResult: APNsResult?

        init(intent: Intent, item: WorkItem, credentialIndex: Int?) {
            self.intent = intent
            self.item = item
            self.notification = intent.notification
            self.credentialIndex = credentialIndex
        }
    }

    private enum Step {
        /// The outcome is in the delivery's ending.
        case finish
        case send(APNsClient)
        case wait(Duration)
        /// Into the device's mailbox until `due` (epoch ms), after a 429 or past the retry budget.
        case park(due: Int64, tooManyRequests: Bool)
    }

    /// Applies the intent's badge change in Redis (once per intent, retries and redeliveries
    /// included) and writes the count into the payload. False when the delivery ended here
    /// (its ending says how).
    @inline(never)
    private func applyBadge(_ delivery: Delivery) async -> Bool {
        guard let change = delivery.intent.badge else { return true }
        let intent = delivery.intent
        guard let badges else {
            delivery.ending.outcome = makeOutcome(delivery.item, intent: intent, status: .failed, reason: "BadgeNeedsRedis")
            return false
        }
        guard let count = await withRedisRetries(delivery.item, { () throws(RedisError) in
            try await badges.apply(change, intentID: intent.id, token: intent.token, topic: intent.topic)
        }) else {
            // Failing open (or refused): the payload goes as it came; revoked: abandoned.
            return isCurrent(delivery.item) && !Task.isCancelled
        }
        delivery.badge = count
        delivery.notification.payload = BadgeStore.payload(delivery.notification.payload, badge: count)
        return true
    }

    /// Sends with retries; the outcome goes to the delivery's ending (nil there when the work
    /// was abandoned, its partition revoked).
    @inline(never)
    private func deliver(_ delivery: Delivery) async {
        delivery.retryDeadline = clock() + configuration.retry.deadlineSeconds
        var step = nextAttempt(delivery)
        while true {
            switch step {
            case .finish:
                return
            case .send(let client):
                let sentAt = ContinuousClock.now
                let answer: Result<APNsResult, any Error>
                do {
                    answer = .success(try await client.send(delivery.notification))
                } catch {
                    answer = .failure(error)
                }
                step = judge(answer, delivery, sentAt: sentAt)
            case .wait(let delay):
                do {
                    try await Task.sleep(for: delay)
                    step = nextAttempt(delivery)
                } catch {
                    step = delivery.finish(timeoutOutcome(delivery))
                }
            case .park(let due, let tooManyRequests):
                step = await park(delivery, due: due, tooManyRequests: tooManyRequests)
            }
        }
    }

    /// Parks the delivery's intent in its mailbox; when that cannot be done, the 429 is retried
    /// like any retryable answer and an intent past the retry budget fails.
    @inline(never)
    private func park(_ delivery: Delivery, due: Int64, tooManyRequests: Bool) async -> Step {
        if await park(delivery.item, due: due, tooManyRequests: tooManyRequests) {
            delivery.ending.parked = true
            return .finish
        }
        return tooManyRequests ? retryOrGiveUp(delivery) : delivery.finish(timeoutOutcome(delivery))
    }

    /// Whether to send now: not when the partition was revoked, the intent expired or its
    /// team's credentials are in a fault cool-down.
    @inline(never)
    private func nextAttempt(_ delivery: Delivery) -> Step {
        let intent = delivery.intent
        let item = delivery.item
        guard isCurrent(item), !Task.isCancelled else { return delivery.finish(nil) }
        guard let credentialIndex = delivery.credentialIndex else {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: "NoCredentials"))
        }
        let now = clock()
        if intent.expiration != 0, now > intent.expiration {
            return delivery.finish(makeOutcome(item, intent: intent, status: .expired, reason: delivery.lastReason ?? "ExpiredBeforeSending",
                                       attempts: delivery.attempts))
        }
        let teamID = configuration.apns.credentials[credentialIndex].teamID
        if let fault = activeCredentialFault(teamID: teamID, now: now) {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: fault, attempts: delivery.attempts))
        }
        do {
            return .send(try client(credentialIndex: credentialIndex, environment: intent.environment))
        } catch {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: "ClientSetup: \(error)", attempts: delivery.attempts))
        }
    }

    /// What APNs' answer (or the send's error) means for the intent.
    @inline(never)
    private func judge(_ answer: Result<APNsResult, any Error>, _ delivery: Delivery, sentAt: ContinuousClock.Instant) -> Step {
        let intent = delivery.intent
        let item = delivery.item
        let result: APNsResult
        switch answer {
        case .success(let value):
            result = value
            RelayMetrics.apnsLatency.recordNanoseconds((ContinuousClock.now - sentAt).totalNanoseconds)
            delivery.attempts += result.attempts
        case .failure(APNsError.invalidNotification(let invalid)):
            return delivery.finish(makeOutcome(item, intent: intent, status: .rejected, reason: invalid.code.rawValue, attempts: delivery.attempts))
        case .failure(let error):
            // Queue full or shutting down: nothing was sent; wait and try again.
            delivery.lastReason = "\(error)"
            return retryOrGiveUp(delivery)
        }
        let teamID = delivery.credentialIndex.map { configuration.apns.credentials[$0].teamID } ?? ""
        switch result.classification {
        case .delivered:
            clearCredentialFault(teamID: teamID)
            return delivery.finish(makeOutcome(item, intent: intent, status: .delivered, result: result, attempts: delivery.attempts))
        case .rejected:
            return delivery.finish(makeOutcome(item, intent: intent, status: .rejected, result: result, attempts: delivery.attempts))
        case .unregistered:
            return delivery.finish(makeOutcome(item, intent: intent, status: .unregistered, result: result, attempts: delivery.attempts))
        case .credentialFault:
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            recordCredentialFault(teamID: teamID, reason: reason ?? "CredentialFault", now: clock())
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, result: result, attempts: delivery.attempts))
        case .retryable:
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            delivery.lastReason = reason
            delivery.lastResult = result
            if intent.expiration == 0 {
                // Now or never: one try.
                return delivery.finish(makeOutcome(item, intent: intent, status: .expired, result: result, attempts: delivery.attempts))
            }
            if result.reason == .tooManyRequests, policy != nil {
                // Too fast for this device: it backs off in Redis and the intent waits in its mailbox.
                return .park(due: nowMilliseconds(), tooManyRequests: true)
            }
            logger.debug("retrying", metadata: metadata(item, ["apns.reason": "\(reason ?? "none")"]))
            RelayMetrics.retries.increment()
            return retryOrGiveUp(delivery)
        }
    }

    /// The next backoff, or the final outcome when waiting it would pass the intent's
    /// expiration or the retry deadline.
    private func retryOrGiveUp(_ delivery: Delivery) -> Step {
        let delay = backoff.delay(attempt: delivery.retry)
        delivery.retry += 1
        let resumeAt = clock() + delay.components.seconds
        if resumeAt > delivery.intent.expiration {
            return delivery.finish(timeoutOutcome(delivery))
        }
        if resumeAt > delivery.retryDeadline {
            // APNs unavailable past the retry budget: with Redis the intent waits in its mailbox
            // (tried again after the longest backoff) instead of failing.
            guard policy != nil else { return delivery.finish(timeoutOutcome(delivery)) }
            return .park(due: nowMilliseconds() + Int64(configuration.retry.maxBackoffMilliseconds), tooManyRequests: false)
        }
        return .wait(delay)
    }

    private func timeoutOutcome(_ delivery: Delivery) -> Outcome {
        let intent = delivery.intent
        let reason = delivery.lastReason
        let expired = intent.expiration <= delivery.retryDeadline
        var outcome = makeOutcome(delivery.item, intent: intent, status: expired ? .expired : .failed,
                                  reason: expired ? (reason ?? "Expired") : "RetryDeadline: \(reason ?? "no answer")",
                                  attempts: delivery.attempts)
        if let last = delivery.lastResult {
            outcome.httpStatus = last.status
            outcome.apnsID = last.apnsID
        }
        return outcome
    }

    struct ClientKey: Hashable {
        var credential: Int
        var endpoint: APNsEndpoint
    }

    private func client(credentialIndex: Int, environment: APNsEnvironment) throws -> APNsClient {
        let key = ClientKey(credential: credentialIndex, endpoint: try endpoints[environment]!.get())
        return try clients.withLock { clients in
            if let existing = clients[key] { return existing }
            var settings = APNsClientConfiguration(endpoint: key.endpoint, credential: .token(tokenSources[credentialIndex]))
            settings.connections = configuration.apns.connections
            settings.insecureSkipVerify = configuration.apns.insecureSkipVerify
            settings.requestTimeout = .seconds(Int64(configuration.apns.requestTimeoutSeconds))
            settings.maxQueuedNotifications = max(configuration.limits.maxInFlight, 1000)
            let client = try APNsClient(configuration: settings, logger: logger)
            clients[key] = client
            return client
        }
    }

    /// Where each environment's intents go: Apple's hosts when `apns.endpoint` is
    /// `production`, else the one endpoint configured.
    private static func endpoints(_ configured: String) -> [APNsEnvironment: Result<APNsEndpoint, APNsError>] {
        guard configured != "production" else { return [.production: .success(.production), .development: .success(.development)] }
        let endpoint = Result { () throws(APNsError) in try APNsEndpoint(parsing: configured) }
        return [.production: endpoint, .development: endpoint]
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

    /// Publishes until the delivery report succeeds (retrying with backoff). False when the
    /// item's partition was revoked meanwhile (the outcome may not be out).
    @inline(never)
    private func publish(_ ending: Ending, _ item: WorkItem) async -> Bool {
        guard let (key, value) = Self.encoded(ending) else { return false }
        var retry = 0
        while true {
            do {
                _ = try await producer.send(topic: configuration.kafka.outcomesTopic, key: key, value: value)
                break
            } catch {
                publishFailed(item, error)
                if !isCurrent(item) { return false }
                try? await Task.sleep(for: backoff.delay(attempt: retry))
                retry += 1
            }
        }
        published(ending)
        return true
    }

    /// An outcome's delivery failed (it is tried again).
    private func publishFailed(_ item: WorkItem, _ error: KafkaError) {
        logger.warning("outcome not published yet", metadata: metadata(item, ["kafka.error": "\(error)"]))
        RelayMetrics.publishFailures.increment()
        state.withLock { $0.publishFailures += 1 }
    }

    /// The outcome as published: key and value (kept out of `publish`'s frame).
    @inline(never)
    private static func encoded(_ ending: Ending) -> ([UInt8]?, [UInt8])? {
        guard let outcome = ending.outcome else { return nil }
        return (outcome.token.map { Array($0.utf8) }, outcome.utf8)
    }

    /// Counts a published outcome.
    @inline(never)
    private func published(_ ending: Ending) {
        guard let outcome = ending.outcome else { return }
        state.withLock { $0.outcomeCounts[outcome.status.rawValue, default: 0] += 1 }
        RelayMetrics.outcome(outcome)
        published?(outcome)
    }

    /// Ends an item: its offset becomes committable once it and every earlier one are done.
    ///
    /// The offset is stored inside the state lock: two items finishing at once must store their
    /// positions in order (a later store of an older position would move the commit back), and
    /// the drain that waits for the last item must find its offset stored.
    private func finish(_ item: WorkItem, stored: Bool) {
        let (notStored, waiters, inFlight) = state.withLock { state -> (Int64?, [CheckedContinuation<Void, Never>], Int) in
            state.inFlight -= 1
            if let member = item.mailboxMember { state.mailboxJobs.remove(member) }
            var notStored: Int64?
            // Intents from a mailbox had their offsets stored when they were parked.
            if stored, item.mailboxMember == nil, state.generations[item.partition] == item.generation, state.trackers[item.partition] != nil,
               let committable = state.trackers[item.partition]!.finish(item.offset) {
                do {
                    try consumer.storeOffset(item.partition, offset: committable)
                } catch {
                    notStored = committable
                }
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
            return (notStored, waiters, state.inFlight)
        }
        if let notStored {
            logger.info("offset not stored (partition no longer ours)", metadata: [
                "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(notStored)",
            ])
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
