import CRdKafka
import Foundation
import Logging
import Synchronization

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
func pollOnce(_ handle: KafkaHandle, _ shared: ConsumerShared, batchSize: Int) {
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

let rebalance: @convention(c) (OpaquePointer?, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?, UnsafeMutableRawPointer?) -> Void = { rk, error, list, opaque in
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
        // Commit what is stored first, so the partitions' next owner starts exactly behind the
        // work finished here (synchronous: the callback runs on the poll thread). The revocation's
        // list carries no offsets (committing it commits nothing): commit the stored offsets of
        // the assignment instead, which still holds these partitions.
        if list != nil, rd_kafka_assignment_lost(rk) == 0 {
            let committed = rd_kafka_commit(rk, nil, 0)
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

let consumerError: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = { _, code, reason, opaque in
    guard let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    let text = reason.map { String(cString: $0) } ?? "unknown"
    shared.logger.warning("Kafka consumer error", metadata: ["kafka.error": "\(text)", "kafka.code": "\(code)"])
}
