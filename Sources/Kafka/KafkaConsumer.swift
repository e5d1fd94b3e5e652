import Common
import CRdKafka
import Foundation
public import Logging
public import ServiceLifecycle
import Synchronization

/// A consumer-group member (cooperative-sticky assignment) that hands records and rebalances to
/// Swift as an `AsyncSequence`, in batches pulled on a dedicated thread.
///
/// Offsets are stored by the application (``storeOffset(_:offset:)``, `enable.auto.offset.store`
/// off) and committed by librdkafka in the background (`enable.auto.commit`), when partitions are
/// revoked, and once more on ``close()``. The hand-over buffer is bounded: when it is full the
/// poll thread waits for the application to catch up, and if that takes longer than a few
/// seconds it pauses every assigned partition and keeps polling (so rebalances and the group
/// session are served), resuming once the application caught up. ``pause(_:)`` and
/// ``resume(_:)`` give the application the same lever (``ConsumerFlowControl`` decides).
///
/// The initialiser only configures librdkafka: the subscription and the poll thread start with
/// ``run()`` (the consumer is a `Service`; a graceful shutdown closes it) or with the first read
/// of ``events``, whichever comes first.
public final class KafkaConsumer: Service, Sendable {
    private let handle: KafkaHandle
    /// ``offsetStoreCalls``.
    private let offsetStores = Atomic<Int>(0)
    private let shared: ConsumerShared
    private let logger: Logger
    private let topics: [String]
    private let batchSize: Int
    /// The poll thread, once started; nil again after ``close()``.
    private let polling = Locked<Polling>(.notStarted)
    /// Opened by ``close()``.
    private let closed = AsyncLatch()
    private let subscriptionFailure = Locked<KafkaError?>(nil)
    /// How long ``close()`` waits for the first sync of a join under way.
    private let firstSyncTimeout: Duration
    /// Set by ``close()`` when it left the client undestroyed: see ``clientLeftUndestroyed``.
    private let undestroyed = Locked(false)

    /// Why librdkafka refused the subscription, if it did: the consumer never gets a record.
    public var failure: KafkaError? { subscriptionFailure.withLock { $0 } }

    private enum Polling {
        case notStarted
        case running(PollThread)
        case closed
    }

    /// - Parameters:
    ///   - maxBatch: records per `.messages` event at most.
    ///   - bufferedMessages: records waiting for the application before partitions get paused
    ///     (they resume at half of it).
    ///   - properties: passed to librdkafka as they are, after the defaults (so they win).
    ///   - topicQueues: with more than one topic, each topic's records come through a queue of
    ///     their own, taken while fewer than `outstandingPerTopic` of that topic's records are
    ///     handed over and not ``release(topic:records:)``d: a topic the application is behind
    ///     on waits in librdkafka (its prefetch bounded as usual) without holding up the others,
    ///     and without pausing anything. Rebalances still come in order with them (a
    ///     partition's own errors come through its topic's queue).
    ///   - firstSyncTimeout: how long ``close()`` waits for the first assignment of a join under
    ///     way.
    public init(bootstrapServers: String, groupID: String, topics: [String], properties: [String: String] = [:],
                maxBatch: Int = 500, bufferedMessages: Int = 5000, topicQueues: Bool = false, outstandingPerTopic: Int = 5000,
                firstSyncTimeout: Duration = .seconds(10),
                logger: Logger = Logger(label: "apns-relay.kafka.consumer")) throws(KafkaError) {
        var settings: [String: String] = [
            "bootstrap.servers": bootstrapServers,
            "group.id": groupID,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.offset.store": "false",
            "enable.auto.commit": "true",
            "auto.commit.interval.ms": "500",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": "false",
        ]
        settings.merge(properties) { _, given in given }
        let builder = try KafkaConfigBuilder(settings)
        let separate = topicQueues && topics.count > 1
        // Each topic may have its share handed over at once without the buffer counting as full.
        let shared = ConsumerShared(capacity: separate ? max(bufferedMessages, outstandingPerTopic * topics.count + maxBatch) : bufferedMessages,
                                    outstandingLimit: outstandingPerTopic,
                                    cooperative: settings["partition.assignment.strategy"]?.contains("cooperative") ?? false, logger: logger)
        shared.install(on: builder)
        builder.withConf { conf in
            rd_kafka_conf_set_rebalance_cb(conf, rebalance)
            rd_kafka_conf_set_error_cb(conf, consumerError)
        }
        let handle = try KafkaHandle(type: RD_KAFKA_CONSUMER, configuration: builder, context: shared)
        handle.withHandle { rk in
            _ = rd_kafka_poll_set_consumer(rk)
            if separate { shared.makeTopicQueues(rk, topics: topics) }
        }
        self.handle = handle
        self.shared = shared
        self.logger = logger
        self.topics = topics
        self.batchSize = max(maxBatch, 1)
        self.firstSyncTimeout = firstSyncTimeout
    }

    deinit {
        if case .running(let poller) = polling.withLock({ $0 }) {
            poller.stop()
            // Not closed: `rd_kafka_destroy` closes it, unless it may be in the state that aborts
            // (then it leaves the group first, and the state is asked once it cannot change).
            if !topics.isEmpty, failure == nil, shared.configuredCooperative, !shared.membership.value.synced {
                let unsubscribed = handle.withHandle { rd_kafka_unsubscribe($0) } == RD_KAFKA_RESP_ERR_NO_ERROR
                if mayAbortOnDestroy(unsubscribed: unsubscribed) { keepClientUndestroyed() }
            }
        }
        shared.queue.finish()
        // Before the handle destroys the client.
        shared.destroyTopicQueues()
    }

    /// Subscribes and starts the poll thread, once (later calls, and calls after ``close()``, do
    /// nothing). A refused subscription reaches the application as an `.error` event.
    public func start() {
        polling.withLock { polling in
            guard case .notStarted = polling else { return }
            // No topics: a group member that only reads or commits offsets (no subscription).
            let subscribed = topics.isEmpty ? RD_KAFKA_RESP_ERR_NO_ERROR : handle.withHandle { rk in
                withPartitionList(topics.map { TopicPartition(topic: $0, partition: RD_KAFKA_PARTITION_UA) }) { list in
                    rd_kafka_subscribe(rk, list)
                }
            }
            if subscribed != RD_KAFKA_RESP_ERR_NO_ERROR {
                let error = KafkaError(subscribed, context: "subscribe to \(topics.joined(separator: ", "))")
                subscriptionFailure.withLock { $0 = error }
                shared.push(.error(error))
            }
            let (handle, shared, batchSize) = (self.handle, self.shared, self.batchSize)
            polling = .running(PollThread(name: "kafka-consumer-poll") {
                pollOnce(handle, shared, batchSize: batchSize)
            })
        }
    }

    /// Starts consuming, waits for a graceful shutdown (or cancellation), then ``close()``s.
    public func run() async {
        start()
        await waitForGracefulShutdown(orUntil: closed)
        await close()
    }

    /// Records and rebalances, in order. One consumer of this sequence at a time; making its
    /// iterator starts the consumer (``start()``).
    public var events: Events { Events(consumer: self) }

    public struct Events: AsyncSequence, Sendable {
        public typealias Element = KafkaConsumerEvent
        let consumer: KafkaConsumer

        public struct AsyncIterator: AsyncIteratorProtocol {
            let queue: AsyncBoundedQueue<KafkaConsumerEvent>
            public mutating func next() async -> KafkaConsumerEvent? {
                await queue.pop()
            }
        }

        public func makeAsyncIterator() -> AsyncIterator {
            consumer.start()
            return AsyncIterator(queue: consumer.shared.queue)
        }
    }

    /// Marks `offset` as processed: the committed position becomes `offset + 1`. Fails for a
    /// partition that is no longer assigned (a rebalance took it), which is what keeps a revoked
    /// partition's late work from being committed.
    public func storeOffset(_ partition: TopicPartition, offset: Int64) throws(KafkaError) {
        if let (_, error) = storeOffsets([(partition, offset)]).first { throw error }
    }

    /// ``storeOffset(_:offset:)`` for several partitions in one call (one
    /// `rd_kafka_offsets_store`): returns those whose offset was not stored, with librdkafka's
    /// reason (a partition no longer assigned: `_STATE`; one this client never knew:
    /// `_UNKNOWN_PARTITION`; every one, `_INVALID_ARG`, when `enable.auto.offset.store` is on);
    /// empty when every one was.
    public func storeOffsets(_ offsets: [(partition: TopicPartition, offset: Int64)]) -> [(TopicPartition, KafkaError)] {
        guard !offsets.isEmpty else { return [] }
        offsetStores.add(1, ordering: .relaxed)
        return handle.withHandle { rk in
            withPartitionList(offsets.map(\.partition), offsets: offsets.map { $0.offset + 1 }) { list in
                let error = rd_kafka_offsets_store(rk, list)
                var failed: [(TopicPartition, KafkaError)] = []
                for (index, (partition, offset)) in offsets.enumerated() {
                    // Each element's own error, or the call's when it refused the list as a whole
                    // (automatic offset stores configured) without looking at the elements.
                    let code = error == RD_KAFKA_RESP_ERR__INVALID_ARG ? error : list.pointee.elems[index].err
                    if code != RD_KAFKA_RESP_ERR_NO_ERROR {
                        failed.append((partition, KafkaError(code, context: "store offset \(offset) for \(partition)")))
                    }
                }
                return failed
            }
        }
    }

    /// Calls to `rd_kafka_offsets_store` so far (each one stores one or several partitions'
    /// offsets, ``storeOffsets(_:)``).
    package var offsetStoreCalls: Int { offsetStores.load(ordering: .relaxed) }

    /// Installs what hears of a revocation first: called on the poll thread when librdkafka
    /// revokes partitions, before their stored offsets are committed and they are unassigned
    /// (`lost`: the group already gave them to others, nothing can be committed). The handler
    /// may block, bounded: it is the moment to stop new work of those partitions and let the
    /// work under way store its offsets. The `.revoked` event follows in ``events``.
    public func onRevoking(_ handler: @escaping @Sendable ([TopicPartition], _ lost: Bool) -> Void) {
        shared.revocationHandler.set(handler)
    }

    /// Revocations whose commit failed so far: the revoked partitions' next owners start from
    /// an earlier commit, and send again what was finished here since.
    public var revocationCommitFailures: Int { shared.revocationCommitFailures.load(ordering: .relaxed) }

    /// The application is done with `records` of `topic` handed over (with topic queues: they
    /// no longer count against the topic's limit).
    public func release(topic: String, records: Int) {
        guard let index = shared.topicQueueIndex(topic) else { return }
        shared.outstanding.withLock { $0[index] = max($0[index] - records, 0) }
    }

    /// Stops fetching from these partitions (assigned ones; the wish ends with their
    /// assignment) until ``resume(_:)``. Returns at once: the poll thread pauses them on its next
    /// turn (within 100 ms, unless it is serving a rebalance: then after it), as librdkafka's
    /// call waits for the partitions' broker threads, which no caller's thread or event loop
    /// should. Records fetched before that are still handed over.
    public func pause(_ partitions: [TopicPartition]) {
        shared.flow.withLock { $0.applicationPaused(partitions) }
    }

    /// Fetches from these partitions again (not while the consumer's buffer is full: they
    /// resume with the others). Returns at once, as ``pause(_:)`` does.
    public func resume(_ partitions: [TopicPartition]) {
        shared.flow.withLock { $0.applicationResumed(partitions) }
    }

    /// Turns of the poll thread that applied pauses or resumes so far: a test waits for it to
    /// move past a value read after its ``pause(_:)``.
    package var pausesApplied: Int { shared.applicationPausesApplied.load(ordering: .acquiring) }

    /// The partitions paused in librdkafka now, by the application or while the buffer is full.
    public var paused: Set<TopicPartition> { shared.flow.withLock { $0.paused } }

    /// Commits the stored offsets now and waits for the broker's answer.
    public func commit() async throws(KafkaError) {
        let handle = self.handle
        let result = await runBlocking {
            handle.withHandle { rd_kafka_commit($0, nil, 0) }
        }
        // Nothing stored since the last commit is not a failure.
        guard result == RD_KAFKA_RESP_ERR_NO_ERROR || result == RD_KAFKA_RESP_ERR__NO_OFFSET else {
            throw KafkaError(result, context: "commit")
        }
    }

    /// Hands each of librdkafka's statistics to `handler` (from the poll thread), every
    /// `statistics.interval.ms` (0, librdkafka's default, emits none).
    public func onStatistics(_ handler: @escaping @Sendable (KafkaStatistics) -> Void) {
        shared.statistics.set(handler)
    }

    /// Leaves the group (revoking every partition, whose stored offsets are committed) and ends
    /// ``events``. Later calls wait for the first one to finish.
    ///
    /// The member leaves while its poll thread still serves the group, and only then is
    /// librdkafka's consumer closed, because librdkafka 2.0.2 aborts the process when a member is
    /// closed at the wrong moment of a rebalance:
    /// - one that joined the group but never completed a sync (`rd_kafka_sticky_assignor_state_destroy`,
    ///   with the cooperative-sticky assignor, confluentinc/librdkafka#4312): the close first
    ///   waits, up to `firstSyncTimeout` (an init parameter), for the assignment its join is
    ///   about to receive. A member still in that state once it left the group (the sync never
    ///   came back, or the join was answered while the close began) has its client closed but
    ///   never destroyed (``clientLeftUndestroyed``): its threads stay until the process exits,
    ///   which does not abort;
    /// - one closed while an assignment is still being applied (`rd_kafka_cgrp_terminated`): it
    ///   unsubscribes first and waits, up to ``leaveTimeout``, until the revocation that follows
    ///   is served (the revocation's commit and unassignment done).
    /// Past either bound the close goes on (a member cut off from its coordinator has nothing to
    /// wait for).
    public func close() async {
        let previous = polling.withLock { polling in
            defer { polling = .closed }
            return polling
        }
        if case .closed = previous {
            _ = await closed.wait()
            return
        }
        shared.flow.withLock { $0.closing() }
        let (handle, shared) = (self.handle, self.shared)
        let poller: PollThread? = if case .running(let poller) = previous { poller } else { nil }
        let logger = self.logger
        if poller != nil, !topics.isEmpty, failure == nil {
            // Not cut short if the closing task is cancelled: that would reopen the moments
            // librdkafka aborts in.
            let unsubscribed = await Task { await self.leaveGroup() }.value
            if await runBlocking({ self.mayAbortOnDestroy(unsubscribed: unsubscribed) }) { keepClientUndestroyed() }
        }
        await runBlocking {
            poller?.stop()
            // The final commit can meet a rebalance or a coordinator change: try a few times.
            for attempt in 0..<5 {
                let result = handle.withHandle { rd_kafka_commit($0, nil, 0) }
                if result == RD_KAFKA_RESP_ERR_NO_ERROR || result == RD_KAFKA_RESP_ERR__NO_OFFSET { break }
                logger.warning("final commit failed", metadata: [
                    "kafka.error": "\(String(cString: rd_kafka_err2str(result)))", "kafka.attempt": "\(attempt + 1)",
                ])
                usleep(UInt32(100_000 << attempt))
            }
            _ = handle.withHandle { rd_kafka_consumer_close($0) }
            shared.destroyTopicQueues()
        }
        shared.queue.finish()
        logger.info("consumer closed: offsets committed, left the group")
        closed.open()
    }

    /// Whether ``close()`` left this member's client undestroyed, as librdkafka 2.0.2 aborts
    /// the process destroying a member that joined the group and never received its first
    /// assignment (see ``close()``).
    public var clientLeftUndestroyed: Bool { undestroyed.withLock { $0 } }

    /// The group's rebalance protocol as librdkafka names it once a JoinGroup was answered
    /// (`COOPERATIVE` or `EAGER`), `NONE` before; nil once the consumer is closed. Blocks
    /// until librdkafka's main thread answers.
    public var rebalanceProtocol: String? {
        handle.withHandle { rk in rd_kafka_rebalance_protocol(rk).map { String(cString: $0) } }
    }

    /// Keeps the client from ever being destroyed (see ``close()``): held here until the
    /// process exits.
    private func keepClientUndestroyed() {
        logger.error("a group member that joined and never received its first assignment is left: its Kafka client is not destroyed (librdkafka 2.0.2 aborts the process destroying it) and stays until the process exits")
        undestroyed.withLock { $0 = true }
        Self.clientsKept.withLock { $0.append(handle) }
    }

    /// The clients ``keepClientUndestroyed()`` kept.
    private static let clientsKept = Locked<[KafkaHandle]>([])

    /// Whether destroying the client could abort the process: this member never received an
    /// assignment, and librdkafka chose the cooperative assignor for it (a JoinGroup was
    /// answered; only the cooperative-sticky assignor keeps a state that librdkafka 2.0.2 cannot
    /// destroy before it is made) or may still choose it (the unsubscription failed, so a
    /// JoinGroup answer may still land). Asked after a successful unsubscription, the answer
    /// cannot change any more: librdkafka discards the answers of a join or sync under way from
    /// then on. Blocks.
    private func mayAbortOnDestroy(unsubscribed: Bool) -> Bool {
        guard shared.configuredCooperative, !shared.membership.value.synced else { return false }
        return !unsubscribed || rebalanceProtocol == "COOPERATIVE"
    }

    /// How long ``close()`` waits for the revocation after its unsubscription: the revocation
    /// handler's bound plus the revocation's commit attempts fit in it.
    public static let leaveTimeout: Duration = .seconds(20)

    /// Unsubscribes with the poll thread still running, and waits (bounded) until the member
    /// holds no partition: see ``close()``. False when the unsubscription failed.
    private func leaveGroup() async -> Bool {
        let (handle, shared) = (self.handle, self.shared)
        // librdkafka names a protocol once a JoinGroup was answered (an assignor is chosen),
        // "NONE" before.
        let joined = await runBlocking { [self] in rebalanceProtocol.map { $0 != "NONE" } ?? false }
        if joined, !(await shared.membership.wait(atMost: firstSyncTimeout, until: { $0.synced })) {
            logger.warning("closing before the group's first assignment arrived")
        }
        // Nobody reads the events any more: what is assigned stops fetching, so that records
        // do not pile up while the group is left.
        let held = assignment
        if !held.isEmpty { pause(held) }
        let unsubscribed = await runBlocking { handle.withHandle { rd_kafka_unsubscribe($0) } }
        guard unsubscribed == RD_KAFKA_RESP_ERR_NO_ERROR else {
            logger.warning("unsubscribe failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(unsubscribed)))"])
            return false
        }
        let empty = await shared.membership.wait(atMost: Self.leaveTimeout) { $0.assigned == 0 }
        let assigned = assignment
        if !empty || !assigned.isEmpty {
            logger.warning("closing with partitions still assigned", metadata: ["kafka.partitions": "\(assigned.count)"])
        }
        return true
    }

    /// The current assignment, as the rebalance callbacks applied it (no call into librdkafka:
    /// its `rd_kafka_assignment` waits for its main thread, without a deadline).
    public var assignment: [TopicPartition] {
        Array(shared.flow.withLock { $0.assigned })
    }

    /// Records not yet consumed per assigned partition: the high watermark librdkafka last saw
    /// minus this consumer's position. Cached values, no network round trip; partitions with no
    /// position or watermark yet are left out.
    public var lag: [TopicPartition: Int64] {
        let assigned = assignment
        guard !assigned.isEmpty else { return [:] }
        return handle.withHandle { rk in
            withPartitionList(assigned) { list in
                guard rd_kafka_position(rk, list) == RD_KAFKA_RESP_ERR_NO_ERROR else { return [:] }
                var lag: [TopicPartition: Int64] = [:]
                for index in 0..<Int(list.pointee.cnt) {
                    let element = list.pointee.elems[index]
                    var low: Int64 = -1, high: Int64 = -1
                    guard rd_kafka_get_watermark_offsets(rk, element.topic, element.partition, &low, &high) == RD_KAFKA_RESP_ERR_NO_ERROR,
                          high >= 0, element.offset >= 0 else { continue }
                    lag[TopicPartition(topic: String(cString: element.topic), partition: element.partition)] = max(high - element.offset, 0)
                }
                return lag
            }
        }
    }

    /// Committed offsets (the next offset to read) for these partitions, from the broker.
    public func committed(_ partitions: [TopicPartition], timeout: Duration = .seconds(10)) async throws(KafkaError) -> [TopicPartition: Int64] {
        let handle = self.handle
        let milliseconds = Int32(clamping: timeout.totalMilliseconds)
        let result: Result<[TopicPartition: Int64], KafkaError> = await runBlocking {
            handle.withHandle { rk in
                withPartitionList(partitions) { list in
                    let error = rd_kafka_committed(rk, list, milliseconds)
                    guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { return .failure(KafkaError(error, context: "committed")) }
                    var offsets: [TopicPartition: Int64] = [:]
                    for index in 0..<Int(list.pointee.cnt) {
                        let element = list.pointee.elems[index]
                        offsets[TopicPartition(topic: String(cString: element.topic), partition: element.partition)] = element.offset
                    }
                    return .success(offsets)
                }
            }
        }
        return try result.get()
    }

    /// The partitions' high watermarks as their leaders say now (one query each): how many
    /// records each holds, from offset 0.
    public func highWatermarks(_ partitions: [TopicPartition], timeout: Duration = .seconds(10)) async throws(KafkaError) -> [TopicPartition: Int64] {
        let handle = self.handle
        let milliseconds = Int32(clamping: timeout.totalMilliseconds)
        let result: Result<[TopicPartition: Int64], KafkaError> = await runBlocking {
            handle.withHandle { rk in
                var highs: [TopicPartition: Int64] = [:]
                for partition in partitions {
                    var low: Int64 = 0, high: Int64 = 0
                    let error = rd_kafka_query_watermark_offsets(rk, partition.topic, partition.partition, &low, &high, milliseconds)
                    guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { return .failure(KafkaError(error, context: "watermarks")) }
                    highs[partition] = high
                }
                return .success(highs)
            }
        }
        return try result.get()
    }
}
