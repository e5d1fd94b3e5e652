import Common
import CRdKafka
import Foundation
import Logging
import Synchronization

/// What the poll thread, the C callbacks and the application share: the hand-over queue and
/// the flow control. `@unchecked Sendable`: `flow`, `outstanding` and the revocation handler
/// are behind their locks and the counters atomic; `topicQueues` is set before the poll thread
/// starts; `handedOverOffsets` and `collecting` belong to the poll thread (and its rebalance
/// callback), and to the closing thread only once ``PollThread/stop()`` returned.
final class ConsumerShared: KafkaCallbackContext, @unchecked Sendable {
    /// Events for the application; its size counts records (batches weigh their length).
    let queue: AsyncBoundedQueue<KafkaConsumerEvent>
    let flow: Locked<ConsumerFlowControl>
    /// Told of a revocation on the poll thread before its commit (``KafkaConsumer/onRevoking(_:)``).
    let revocationHandler = LockedFunction<@Sendable ([TopicPartition], _ lost: Bool) -> Void>()
    /// Revocations whose commit failed (``KafkaConsumer/revocationCommitFailures``).
    let revocationCommitFailures = Atomic<Int>(0)
    /// Times the poll thread applied the application's pauses and resumes
    /// (``KafkaConsumer/pausesApplied``).
    let applicationPausesApplied = Atomic<Int>(0)
    /// With topic queues (``KafkaConsumer`` `topicQueues`): each topic's own librdkafka queue,
    /// in the order of the topics; set once, before the poll thread starts. The queues are
    /// destroyed by ``destroyTopicQueues()``, once the poll thread stopped.
    private(set) var topicQueues: [(topic: String, queue: OpaquePointer)] = []
    private let topicQueuesDestroyed = Atomic<Bool>(false)
    /// Per topic queue, records handed over and not released by the application yet, and how
    /// many may be.
    let outstanding: Locked<[Int]>
    let outstandingLimit: Int
    /// Poll thread only: what was handed over per partition, so that a record librdkafka
    /// delivers a second time within one assignment is skipped (``HandedOverOffsets``).
    var handedOverOffsets = HandedOverOffsets()
    /// Poll thread only: the records the main queue's poll collected so far, not handed over
    /// yet. A rebalance callback served in the middle of that poll hands them over before its
    /// own event, so that no record taken before a revocation reaches the application after it.
    var collecting: [KafkaMessage] = []

    /// Whether the configured assignors rebalance cooperatively: what a rebalance goes by when
    /// librdkafka names no protocol (no assignor chosen yet).
    let configuredCooperative: Bool
    /// What the rebalance callback saw of the group, for ``KafkaConsumer/close()`` to wait on.
    let membership = AsyncWatched(GroupMembership())

    init(capacity: Int, outstandingLimit: Int = .max, cooperative: Bool = true, logger: Logger) {
        configuredCooperative = cooperative
        queue = AsyncBoundedQueue(capacity: capacity) { event in
            if case .messages(let batch) = event { return batch.count }
            return 0
        }
        flow = Locked(ConsumerFlowControl(capacity: capacity))
        outstanding = Locked([])
        self.outstandingLimit = max(outstandingLimit, 1)
        super.init(logger: logger)
    }

    /// Makes a librdkafka queue for each topic (before the poll thread starts).
    func makeTopicQueues(_ rk: OpaquePointer, topics: [String]) {
        topicQueues = topics.compactMap { topic in rd_kafka_queue_new(rk).map { (topic, $0) } }
        outstanding.withLock { $0 = Array(repeating: 0, count: topicQueues.count) }
    }

    /// Drops the topic queues (after the consumer closed; later calls do nothing).
    func destroyTopicQueues() {
        guard !topicQueuesDestroyed.exchange(true, ordering: .relaxed) else { return }
        for (_, queue) in topicQueues { rd_kafka_queue_destroy(queue) }
    }

    /// The index of `topic`'s queue, if it has one.
    func topicQueueIndex(_ topic: String) -> Int? {
        topicQueues.firstIndex { $0.topic == topic }
    }

    /// Sends the records of newly assigned `partitions` to their topics' queues (on the poll
    /// thread, before they are assigned, so that none of their records reaches the main queue).
    /// Once the topic queues are destroyed (a consumer dropped without being closed, whose
    /// `rd_kafka_destroy` may still serve a queued assignment), nothing is forwarded.
    func forwardToTopicQueues(_ rk: OpaquePointer, _ partitions: [TopicPartition]) {
        guard !topicQueues.isEmpty, !topicQueuesDestroyed.load(ordering: .relaxed) else { return }
        for partition in partitions {
            guard let index = topicQueueIndex(partition.topic) else { continue }
            guard let queue = rd_kafka_queue_get_partition(rk, partition.topic, partition.partition) else {
                // Its records then go nowhere (librdkafka does not fall back to the main queue).
                logger.error("cannot give a partition its topic's queue", metadata: ["kafka.partition": "\(partition)"])
                continue
            }
            rd_kafka_queue_forward(queue, topicQueues[index].queue)
            rd_kafka_queue_destroy(queue)
        }
    }

    /// Counts records handed over to the application.
    func handedOver(_ batch: [KafkaMessage]) {
        guard !topicQueues.isEmpty else { return }
        outstanding.withLock { outstanding in
            for message in batch {
                if let index = topicQueueIndex(message.topic) { outstanding[index] += 1 }
            }
        }
    }

    /// Queues an event without waiting; returns how many records are queued after it.
    @discardableResult
    func push(_ event: KafkaConsumerEvent) -> Int {
        queue.offer(event) ?? 0
    }
}

/// What the rebalance callback has seen of this member's place in its group.
struct GroupMembership: Sendable {
    /// An assignment was served since the subscription (even an empty one): the member
    /// completed a join and a sync.
    var synced = false
    /// Partitions assigned now.
    var assigned = 0
}

/// A consumed message's headers, copied (a record without any: one librdkafka call answering
/// NOENT).
func headers(of message: UnsafeMutablePointer<rd_kafka_message_t>) -> [KafkaHeader] {
    var list: OpaquePointer?
    guard rd_kafka_message_headers(message, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return [] }
    var headers: [KafkaHeader] = []
    var index = 0
    var name: UnsafePointer<CChar>?
    var value: UnsafeRawPointer?
    var size = 0
    while rd_kafka_header_get_all(list, index, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
        headers.append(KafkaHeader(name: name.map { String(cString: $0) } ?? "",
                                   value: value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) }))
        index += 1
    }
    return headers
}

extension KafkaMessage {
    /// A copy of a record librdkafka handed out (one without an error).
    init(copying message: UnsafeMutablePointer<rd_kafka_message_t>) {
        let record = message.pointee
        var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let timestamp = rd_kafka_message_timestamp(message, &timestampType)
        self.init(topic: record.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? "",
                  partition: record.partition, offset: record.offset,
                  key: record.key.map { Array(UnsafeRawBufferPointer(start: $0, count: record.key_len)) },
                  value: record.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: record.len)) } ?? [],
                  timestamp: timestampType == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : timestamp,
                  headers: Kafka.headers(of: message))
        hasNullValue = record.payload == nil
    }
}

/// One turn of the poll thread: a batch of records (or callbacks), then flow control.
///
/// With topic queues, the main queue (rebalances, errors) is served without waiting, then
/// each topic's queue while its records handed over and not released stay under the limit;
/// only a turn that found nothing waits, 10 ms at most, on the main queue.
func pollOnce(_ handle: KafkaHandle, _ shared: ConsumerShared, batchSize: Int) {
    applyApplicationPauses(handle, shared)
    if shared.topicQueues.isEmpty {
        _ = pollMainQueue(handle, shared, batchSize: batchSize, timeout: 100)
    } else if pollMainQueue(handle, shared, batchSize: batchSize, timeout: 0) + pollTopicQueues(handle, shared, batchSize: batchSize) == 0 {
        _ = pollMainQueue(handle, shared, batchSize: batchSize, timeout: 10)
    }

    // Flow control (``ConsumerFlowControl``): hold off polling while the application is behind,
    // pause everything if that lasts, resume once it caught up.
    while !shared.queue.isFinished {
        let decision = shared.flow.withLock { $0.decide(buffered: shared.queue.size, now: .now) }
        switch decision {
        case .poll:
            return
        case .hold:
            usleep(2_000)
            applyApplicationPauses(handle, shared)
        case .pause(let partitions):
            handle.withHandle { rk in withPartitionList(partitions) { _ = rd_kafka_pause_partitions(rk, $0) } }
            shared.logger.info("consumer paused: the application is behind", metadata: ["kafka.buffered": "\(shared.queue.size)"])
            return
        case .resume(let partitions):
            handle.withHandle { rk in withPartitionList(partitions) { _ = rd_kafka_resume_partitions(rk, $0) } }
            shared.logger.info("consumer resumed")
            return
        }
    }
}

/// Pauses and resumes what the application asked for since the last turn
/// (``ConsumerFlowControl/applicationChanges()``): librdkafka's calls wait for the partitions'
/// broker threads, which only this thread may do.
private func applyApplicationPauses(_ handle: KafkaHandle, _ shared: ConsumerShared) {
    let (pause, resume) = shared.flow.withLock { $0.applicationChanges() }
    guard !pause.isEmpty || !resume.isEmpty else { return }
    handle.withHandle { rk in
        if !pause.isEmpty { withPartitionList(pause) { _ = rd_kafka_pause_partitions(rk, $0) } }
        if !resume.isEmpty { withPartitionList(resume) { _ = rd_kafka_resume_partitions(rk, $0) } }
    }
    shared.applicationPausesApplied.add(1, ordering: .releasing)
}

/// Serves the consumer's main queue: its records (all of them without topic queues) go to the
/// application in one batch, with errors between them; callbacks run. Waits `timeout` ms for
/// the first event. Returns the records handed over.
private func pollMainQueue(_ handle: KafkaHandle, _ shared: ConsumerShared, batchSize: Int, timeout: Int32) -> Int {
    var total = 0
    handle.withHandle { rk in
        var timeout = timeout
        while shared.collecting.count < batchSize, let message = rd_kafka_consumer_poll(rk, timeout) {
            timeout = 0
            total += take(message, into: &shared.collecting, shared)
        }
    }
    return total + handOver(&shared.collecting, shared)
}

/// Takes from each topic's queue that has room, without waiting. Returns the records handed over.
///
/// One record per call (`rd_kafka_consume_queue`), as `rd_kafka_consumer_poll` does: librdkafka
/// 2.0's batch call moves a partition's position past records it then drops when a pause from
/// another thread lands in the middle of the batch (fixed in 2.1.0). Pauses now come only from
/// this thread, between batches; the one-record calls stay all the same (the batch call was not
/// measured against them since).
private func pollTopicQueues(_ handle: KafkaHandle, _ shared: ConsumerShared, batchSize: Int) -> Int {
    let room = shared.outstanding.withLock { $0.map { shared.outstandingLimit - $0 } }
    var total = 0
    for (index, topic) in shared.topicQueues.enumerated() where index < room.count && room[index] > 0 {
        var batch: [KafkaMessage] = []
        var taken = 0
        while taken < min(batchSize, room[index]), let message = rd_kafka_consume_queue(topic.queue, 0) {
            taken += 1
            total += take(message, into: &batch, shared)
        }
        total += handOver(&batch, shared)
    }
    return total
}

/// Adds a consumed message to `batch` (a copy; librdkafka's is destroyed) or, when it is an
/// error, hands the batch over and then the error. Returns the records handed over.
private func take(_ message: UnsafeMutablePointer<rd_kafka_message_t>, into batch: inout [KafkaMessage],
                  _ shared: ConsumerShared) -> Int {
    defer { rd_kafka_message_destroy(message) }
    guard let error = error(of: message) else {
        let record = KafkaMessage(copying: message)
        switch shared.handedOverOffsets.accept(record.topicPartition, offset: record.offset) {
        case .new:
            batch.append(record)
        case .seen(let rewound):
            if rewound {
                shared.logger.warning("librdkafka delivered records of this assignment again: they are skipped", metadata: [
                    "kafka.partition": "\(record.topicPartition)", "kafka.offset": "\(record.offset)",
                    "kafka.next_offset": "\(shared.handedOverOffsets.position(record.topicPartition) ?? -1)",
                ])
            }
        }
        return 0
    }
    let handed = handOver(&batch, shared)
    shared.push(.error(error))
    return handed
}

/// The error a consumed message carries, if it is one.
private func error(of message: UnsafeMutablePointer<rd_kafka_message_t>) -> KafkaError? {
    let record = message.pointee
    guard record.err != RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
    return KafkaError(record.err, context: record.payload.map {
        String(decoding: UnsafeRawBufferPointer(start: $0, count: record.len), as: UTF8.self)
    })
}

/// Hands a batch over (if it holds any record) and empties it; returns its size.
private func handOver(_ batch: inout [KafkaMessage], _ shared: ConsumerShared) -> Int {
    guard !batch.isEmpty else { return 0 }
    let count = batch.count
    shared.handedOver(batch)
    shared.push(.messages(batch))
    batch.removeAll()
    return count
}

let rebalance: @convention(c) (OpaquePointer?, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?, UnsafeMutableRawPointer?) -> Void = { rk, error, list, opaque in
    guard let rk, let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    // Records taken before this rebalance go first (served on the poll thread, or by the
    // consumer's close once that thread stopped: then there are none).
    _ = handOver(&shared.collecting, shared)
    let changed = partitions(of: list)
    // librdkafka names no protocol ("NONE", or NULL when asking failed) before it has chosen an
    // assignor (seen with an eager assignor's first rebalance failing): the configuration says then.
    let named = rd_kafka_rebalance_protocol(rk).map { String(cString: $0) }
    let cooperative = named == nil || named == "NONE" ? shared.configuredCooperative : named == "COOPERATIVE"
    switch error {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
        shared.handedOverOffsets.reset(changed)
        shared.forwardToTopicQueues(rk, changed)
        if cooperative {
            if let failure = rd_kafka_incremental_assign(rk, list) {
                shared.logger.error("incremental assign failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_error_string(failure)))"])
                rd_kafka_error_destroy(failure)
            }
        } else {
            _ = rd_kafka_assign(rk, list)
        }
        let pauseNow = shared.flow.withLock { $0.assigned(changed) }
        if !pauseNow.isEmpty {
            withPartitionList(pauseNow) { _ = rd_kafka_pause_partitions(rk, $0) }
        }
        shared.push(.assigned(changed))
        let held = shared.flow.withLock { $0.assigned.count }
        shared.membership.update { $0.synced = true; $0.assigned = held }
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
        // The application stops new work of these partitions and lets what is under way finish
        // first (bounded by the handler), so that the commit below covers it.
        let lost = list == nil || rd_kafka_assignment_lost(rk) != 0
        shared.revocationHandler.current?(changed, lost)
        // Commit what is stored first, so the partitions' next owner starts exactly behind the
        // work finished here (synchronous: the callback runs on the poll thread). The revocation's
        // list carries no offsets (committing it commits nothing): commit the stored offsets of
        // the assignment instead, which still holds these partitions.
        if list != nil, rd_kafka_assignment_lost(rk) == 0 {
            // The coordinator refuses commits while the group's other members are still joining
            // or syncing (a loaded member can take seconds): tries again with backoff, about
            // 5.5 s at most on this thread (well inside max.poll.interval.ms).
            var committed = rd_kafka_commit(rk, nil, 0)
            for wait: UInt32 in [50_000, 100_000, 200_000, 400_000, 800_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
            where committed == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS {
                usleep(wait)
                committed = rd_kafka_commit(rk, nil, 0)
            }
            if committed != RD_KAFKA_RESP_ERR_NO_ERROR, committed != RD_KAFKA_RESP_ERR__NO_OFFSET {
                shared.revocationCommitFailures.add(1, ordering: .relaxed)
                shared.logger.warning("commit on revocation failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(committed)))"])
            }
        }
        // A partition paused here stays paused in librdkafka across its unassignment, so it
        // would come back paused if it is assigned here again: resume the paused ones first.
        let (paused, held) = shared.flow.withLock { flow in
            let paused = flow.revoked(changed)
            return (paused, flow.assigned.count)
        }
        if !paused.isEmpty { withPartitionList(paused) { _ = rd_kafka_resume_partitions(rk, $0) } }
        // Unassign before telling the application, so that from the moment it hears of the
        // revocation its offset stores for these partitions fail.
        if cooperative {
            if let failure = rd_kafka_incremental_unassign(rk, list) {
                rd_kafka_error_destroy(failure)
            }
        } else {
            _ = rd_kafka_assign(rk, nil)
        }
        shared.handedOverOffsets.reset(changed)
        shared.push(.revoked(changed))
        shared.membership.update { $0.assigned = held }
    default:
        shared.logger.error("rebalance failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(error)))"])
        let (assigned, paused) = shared.flow.withLock { $0.lostAssignment() }
        shared.revocationHandler.current?(assigned, true)
        if !paused.isEmpty { withPartitionList(paused) { _ = rd_kafka_resume_partitions(rk, $0) } }
        _ = rd_kafka_assign(rk, nil)
        shared.handedOverOffsets.resetAll()
        shared.push(.revoked(assigned))
        shared.membership.update { $0.assigned = 0 }
    }
}

let consumerError: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = { _, code, reason, opaque in
    guard let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    let text = reason.map { String(cString: $0) } ?? "unknown"
    shared.logger.warning("Kafka consumer error", metadata: ["kafka.error": "\(text)", "kafka.code": "\(code)"])
}
