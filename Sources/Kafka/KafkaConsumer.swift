import CRdKafka
import Foundation
public import Logging
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
/// ``resume(_:)`` give the application the same lever.
public final class KafkaConsumer: Sendable {
    private let handle: KafkaHandle
    private let shared: ConsumerShared
    private let poller: PollThread
    private let logger: Logger

    /// - Parameters:
    ///   - maxBatch: records per `.messages` event at most.
    ///   - bufferedMessages: records waiting for the application before partitions get paused
    ///     (they resume at half of it).
    ///   - properties: passed to librdkafka as they are, after the defaults (so they win).
    public init(bootstrapServers: String, groupID: String, topics: [String], properties: [String: String] = [:],
                maxBatch: Int = 500, bufferedMessages: Int = 5000,
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
        let shared = ConsumerShared(capacity: bufferedMessages, logger: logger)
        shared.install(on: builder)
        builder.withConf { conf in
            rd_kafka_conf_set_rebalance_cb(conf, rebalance)
            rd_kafka_conf_set_error_cb(conf, consumerError)
        }
        let handle = try KafkaHandle(type: RD_KAFKA_CONSUMER, configuration: builder, context: shared)
        handle.withHandle { _ = rd_kafka_poll_set_consumer($0) }
        // No topics: a group member that only reads or commits offsets (no subscription).
        let subscribed = topics.isEmpty ? RD_KAFKA_RESP_ERR_NO_ERROR : handle.withHandle { rk in
            withPartitionList(topics.map { TopicPartition(topic: $0, partition: RD_KAFKA_PARTITION_UA) }) { list in
                rd_kafka_subscribe(rk, list)
            }
        }
        guard subscribed == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(subscribed, context: "subscribe to \(topics.joined(separator: ", "))")
        }
        self.handle = handle
        self.shared = shared
        self.logger = logger
        let batchSize = max(maxBatch, 1)
        self.poller = PollThread(name: "kafka-consumer-poll") {
            pollOnce(handle, shared, batchSize: batchSize)
        }
    }

    deinit {
        poller.stop()
        shared.finish()
    }

    /// Records and rebalances, in order. One consumer of this sequence at a time.
    public var events: Events { Events(shared: shared) }

    public struct Events: AsyncSequence, Sendable {
        public typealias Element = KafkaConsumerEvent
        let shared: ConsumerShared

        public struct AsyncIterator: AsyncIteratorProtocol {
            let shared: ConsumerShared
            public mutating func next() async -> KafkaConsumerEvent? {
                await shared.next()
            }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(shared: shared) }
    }

    /// Marks `offset` as processed: the committed position becomes `offset + 1`. Fails for a
    /// partition that is no longer assigned (a rebalance took it), which is what keeps a revoked
    /// partition's late work from being committed.
    public func storeOffset(_ partition: TopicPartition, offset: Int64) throws(KafkaError) {
        let result = handle.withHandle { rk in
            withPartitionList([partition], offsets: [offset + 1]) { list in
                let error = rd_kafka_offsets_store(rk, list)
                if error == RD_KAFKA_RESP_ERR_NO_ERROR, list.pointee.cnt > 0, list.pointee.elems[0].err != RD_KAFKA_RESP_ERR_NO_ERROR {
                    return list.pointee.elems[0].err
                }
                return error
            }
        }
        guard result == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(result, context: "store offset \(offset) for \(partition)")
        }
    }

    /// Stops fetching from these partitions until ``resume(_:)``.
    public func pause(_ partitions: [TopicPartition]) {
        shared.applicationPaused.withLock { $0.formUnion(partitions) }
        handle.withHandle { rk in
            withPartitionList(partitions) { _ = rd_kafka_pause_partitions(rk, $0) }
        }
    }

    public func resume(_ partitions: [TopicPartition]) {
        let resumable = shared.applicationPaused.withLock { paused in
            paused.subtract(partitions)
            return shared.bufferFull.withLock { $0 } ? [] : partitions
        }
        guard !resumable.isEmpty else { return }
        handle.withHandle { rk in
            withPartitionList(resumable) { _ = rd_kafka_resume_partitions(rk, $0) }
        }
    }

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

    /// Commits what is stored, leaves the group (revoking every partition) and ends ``events``.
    public func close() async {
        let handle = self.handle
        let poller = self.poller
        let logger = self.logger
        await runBlocking {
            poller.stop()
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
        }
        shared.finish()
    }

    /// The current assignment.
    public var assignment: [TopicPartition] {
        handle.withHandle { rk in
            var list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
            guard rd_kafka_assignment(rk, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return [] }
            defer { rd_kafka_topic_partition_list_destroy(list) }
            return partitions(of: list)
        }
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
        let milliseconds = Int32(clamping: timeout.components.seconds * 1000)
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
}

/// What the poll thread, the C callbacks and the application share. Everything behind locks.
final class ConsumerShared: KafkaCallbackContext, @unchecked Sendable {
    struct Queue {
        var events: [KafkaConsumerEvent] = []
        /// Records in `events`.
        var messages = 0
        var waiter: CheckedContinuation<KafkaConsumerEvent?, Never>?
        var finished = false
    }

    let capacity: Int
    let queue = Mutex(Queue())
    let applicationPaused = Mutex(Set<TopicPartition>())
    let bufferFull = Mutex(false)
    /// The current assignment, for pausing everything when the buffer fills.
    let assigned = Mutex(Set<TopicPartition>())

    init(capacity: Int, logger: Logger) {
        self.capacity = max(capacity, 1)
        super.init(logger: logger)
    }

    /// Queues an event; returns how many records are queued after it.
    @discardableResult
    func push(_ event: KafkaConsumerEvent) -> Int {
        let (waiter, count) = queue.withLock { queue -> (CheckedContinuation<KafkaConsumerEvent?, Never>?, Int) in
            if queue.finished { return (nil, 0) }
            if let waiter = queue.waiter {
                queue.waiter = nil
                return (waiter, queue.messages)
            }
            queue.events.append(event)
            queue.messages += Self.records(in: event)
            return (nil, queue.messages)
        }
        waiter?.resume(returning: event)
        return count
    }

    private static func records(in event: KafkaConsumerEvent) -> Int {
        if case .messages(let batch) = event { return batch.count }
        return 0
    }

    /// The next event; nil once the consumer is closed or the waiting task is cancelled.
    func next() async -> KafkaConsumerEvent? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready: KafkaConsumerEvent?? = queue.withLock { queue in
                    if !queue.events.isEmpty {
                        let event = queue.events.removeFirst()
                        queue.messages -= Self.records(in: event)
                        return .some(event)
                    }
                    if queue.finished || Task.isCancelled { return .some(nil) }
                    queue.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let waiter = queue.withLock { queue in
                defer { queue.waiter = nil }
                return queue.waiter
            }
            waiter?.resume(returning: nil)
        }
    }

    var queuedMessages: Int { queue.withLock { $0.messages } }

    var isFinished: Bool { queue.withLock { $0.finished } }

    func finish() {
        let waiter = queue.withLock { queue in
            queue.finished = true
            defer { queue.waiter = nil }
            return queue.waiter
        }
        waiter?.resume(returning: nil)
    }
}

/// One turn of the poll thread: a batch of records (or callbacks), then flow control.
private func pollOnce(_ handle: KafkaHandle, _ shared: ConsumerShared, batchSize: Int) {
    var batch: [KafkaMessage] = []
    handle.withHandle { rk in
        var timeout: Int32 = 100
        while batch.count < batchSize, let message = rd_kafka_consumer_poll(rk, timeout) {
            timeout = 0
            defer { rd_kafka_message_destroy(message) }
            let record = message.pointee
            if record.err != RD_KAFKA_RESP_ERR_NO_ERROR {
                if !batch.isEmpty {
                    shared.push(.messages(batch))
                    batch.removeAll()
                }
                shared.push(.error(KafkaError(record.err, context: record.payload.map {
                    String(decoding: UnsafeRawBufferPointer(start: $0, count: record.len), as: UTF8.self)
                })))
                continue
            }
            let topic = record.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? ""
            let value = record.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: record.len)) } ?? []
            let key = record.key.map { Array(UnsafeRawBufferPointer(start: $0, count: record.key_len)) }
            var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
            let timestamp = rd_kafka_message_timestamp(message, &timestampType)
            batch.append(KafkaMessage(topic: topic, partition: record.partition, offset: record.offset, key: key,
                                      value: value, timestamp: timestampType == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : timestamp))
        }
    }
    let queued = batch.isEmpty ? shared.queuedMessages : shared.push(.messages(batch))

    // Flow control. While the application is behind, stop polling for a while (librdkafka keeps
    // its bounded prefetch; nothing is purged and fetched again). If it stays behind longer
    // than `blockLimit`, pause every assigned partition and go back to polling, so that
    // rebalances and the group session keep being served; resume once it caught up.
    let blockLimit = Duration.seconds(5)
    if queued >= shared.capacity, !shared.bufferFull.withLock({ $0 }) {
        let giveUpAt = ContinuousClock.now + blockLimit
        while shared.queuedMessages > shared.capacity / 2, ContinuousClock.now < giveUpAt, !shared.isFinished {
            usleep(2_000)
        }
        if shared.queuedMessages > shared.capacity / 2 {
            shared.bufferFull.withLock { $0 = true }
            let all = Array(shared.assigned.withLock { $0 })
            handle.withHandle { rk in withPartitionList(all) { _ = rd_kafka_pause_partitions(rk, $0) } }
            shared.logger.info("consumer paused: the application is behind", metadata: ["kafka.buffered": "\(shared.queuedMessages)"])
        }
    } else if shared.bufferFull.withLock({ $0 }), queued <= shared.capacity / 2 {
        shared.bufferFull.withLock { $0 = false }
        let paused = shared.applicationPaused.withLock { $0 }
        let resumable = shared.assigned.withLock { $0 }.subtracting(paused)
        handle.withHandle { rk in withPartitionList(Array(resumable)) { _ = rd_kafka_resume_partitions(rk, $0) } }
        shared.logger.info("consumer resumed")
    }
}

private let rebalance: @convention(c) (OpaquePointer?, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?, UnsafeMutableRawPointer?) -> Void = { rk, error, list, opaque in
    guard let rk, let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    let changed = partitions(of: list)
    let cooperative = String(cString: rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE"
    switch error {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
        if cooperative {
            if let failure = rd_kafka_incremental_assign(rk, list) {
                shared.logger.error("incremental assign failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_error_string(failure)))"])
                rd_kafka_error_destroy(failure)
            }
        } else {
            _ = rd_kafka_assign(rk, list)
        }
        shared.assigned.withLock { $0.formUnion(changed) }
        if shared.bufferFull.withLock({ $0 }) {
            _ = rd_kafka_pause_partitions(rk, list)
        }
        shared.push(.assigned(changed))
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
        // Commit what is stored for these partitions first, so their next owner starts exactly
        // behind the work finished here (synchronous: the callback runs on the poll thread).
        if let list, rd_kafka_assignment_lost(rk) == 0 {
            let committed = rd_kafka_commit(rk, list, 0)
            if committed != RD_KAFKA_RESP_ERR_NO_ERROR, committed != RD_KAFKA_RESP_ERR__NO_OFFSET {
                shared.logger.warning("commit on revocation failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(committed)))"])
            }
        }
        // Unassign before telling the application, so that from the moment it hears of the
        // revocation its offset stores for these partitions fail.
        if cooperative {
            if let failure = rd_kafka_incremental_unassign(rk, list) {
                rd_kafka_error_destroy(failure)
            }
        } else {
            _ = rd_kafka_assign(rk, nil)
        }
        shared.assigned.withLock { $0.subtract(changed) }
        shared.applicationPaused.withLock { $0.subtract(changed) }
        shared.push(.revoked(changed))
    default:
        shared.logger.error("rebalance failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(error)))"])
        _ = rd_kafka_assign(rk, nil)
        shared.push(.revoked(Array(shared.assigned.withLock { $0 })))
        shared.assigned.withLock { $0.removeAll() }
    }
}

private let consumerError: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = { _, code, reason, opaque in
    guard let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    let text = reason.map { String(cString: $0) } ?? "unknown"
    shared.logger.warning("Kafka consumer error", metadata: ["kafka.error": "\(text)", "kafka.code": "\(code)"])
}
