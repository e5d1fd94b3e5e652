import Common
import CRdKafka
import Foundation
import Logging
import Synchronization

/// What the poll thread, the C callbacks and the application share: the hand-over queue and
/// the flow control, each behind its lock.
final class ConsumerShared: KafkaCallbackContext, @unchecked Sendable {
    /// Events for the application; its size counts records (batches weigh their length).
    let queue: AsyncBoundedQueue<KafkaConsumerEvent>
    let flow: Mutex<ConsumerFlowControl>
    /// Told of a revocation on the poll thread before its commit (``KafkaConsumer/onRevoking(_:)``).
    let revocationHandler = Mutex<(@Sendable ([TopicPartition], _ lost: Bool) -> Void)?>(nil)
    /// Revocations whose commit failed (``KafkaConsumer/revocationCommitFailures``).
    let revocationCommitFailures = Atomic<Int>(0)

    init(capacity: Int, logger: Logger) {
        queue = AsyncBoundedQueue(capacity: capacity) { event in
            if case .messages(let batch) = event { return batch.count }
            return 0
        }
        flow = Mutex(ConsumerFlowControl(capacity: capacity))
        super.init(logger: logger)
    }

    /// Queues an event without waiting; returns how many records are queued after it.
    @discardableResult
    func push(_ event: KafkaConsumerEvent) -> Int {
        queue.offer(event) ?? 0
    }
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
            batch.append(KafkaMessage(copying: message))
        }
    }
    if !batch.isEmpty { shared.push(.messages(batch)) }

    // Flow control (``ConsumerFlowControl``): hold off polling while the application is behind,
    // pause everything if that lasts, resume once it caught up.
    while !shared.queue.isFinished {
        let decision = shared.flow.withLock { $0.decide(buffered: shared.queue.size, now: .now) }
        switch decision {
        case .poll:
            return
        case .hold:
            usleep(2_000)
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
        let pauseNow = shared.flow.withLock { $0.assigned(changed) }
        if !pauseNow.isEmpty {
            withPartitionList(pauseNow) { _ = rd_kafka_pause_partitions(rk, $0) }
        }
        shared.push(.assigned(changed))
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
        // The application stops new work of these partitions and lets what is under way finish
        // first (bounded by the handler), so that the commit below covers it.
        let lost = list == nil || rd_kafka_assignment_lost(rk) != 0
        shared.revocationHandler.withLock { $0 }?(changed, lost)
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
        // Unassign before telling the application, so that from the moment it hears of the
        // revocation its offset stores for these partitions fail.
        if cooperative {
            if let failure = rd_kafka_incremental_unassign(rk, list) {
                rd_kafka_error_destroy(failure)
            }
        } else {
            _ = rd_kafka_assign(rk, nil)
        }
        shared.flow.withLock { $0.revoked(changed) }
        shared.push(.revoked(changed))
    default:
        shared.logger.error("rebalance failed", metadata: ["kafka.error": "\(String(cString: rd_kafka_err2str(error)))"])
        shared.revocationHandler.withLock { $0 }?(Array(shared.flow.withLock { $0.assigned }), true)
        _ = rd_kafka_assign(rk, nil)
        shared.push(.revoked(shared.flow.withLock { $0.lostAssignment() }))
    }
}

let consumerError: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = { _, code, reason, opaque in
    guard let opaque else { return }
    let shared = Unmanaged<ConsumerShared>.fromOpaque(opaque).takeUnretainedValue()
    let text = reason.map { String(cString: $0) } ?? "unknown"
    shared.logger.warning("Kafka consumer error", metadata: ["kafka.error": "\(text)", "kafka.code": "\(code)"])
}
