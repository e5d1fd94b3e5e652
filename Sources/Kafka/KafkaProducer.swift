import Common
import CRdKafka
import Foundation
public import Logging
public import ServiceLifecycle
import Synchronization

/// An idempotent producer (`enable.idempotence=true`, `acks=all`) whose delivery reports
/// resolve the `send` that made them.
///
/// A dedicated thread calls `rd_kafka_poll`, which serves delivery reports and errors; nothing
/// here blocks a Swift concurrency thread or an event loop. The thread starts with ``run()``
/// (the producer is a `Service`; a graceful shutdown flushes and closes it) or with the first
/// record, whichever comes first; the initialiser only configures librdkafka.
public final class KafkaProducer: Service, Sendable {
    /// What a delivery report said.
    public struct Delivery: Sendable, Equatable {
        public var partition: Int32
        public var offset: Int64
    }

    private let handle: KafkaHandle
    private let callbacks: ProducerCallbacks
    private let topics: Locked<[String: TopicHandle]>
    private let poller = Locked<PollThread?>(nil)
    /// Set once the poll thread runs: the send path checks it without taking the lock.
    private let polling = Atomic<Bool>(false)
    private let logger: Logger
    /// Opened by ``close(timeout:)``.
    private let closedLatch = AsyncLatch()
    /// Set by ``close(timeout:)``: later sends fail at once instead of waiting for a delivery
    /// report nobody would serve.
    private let closed = Atomic<Bool>(false)

    /// - Parameters:
    ///   - bootstrapServers: `host:port[,host:port]`.
    ///   - properties: passed to librdkafka as they are, after the defaults (so they win).
    public init(bootstrapServers: String, properties: [String: String] = [:],
                logger: Logger = Logger(label: "apns-relay.kafka.producer")) throws(KafkaError) {
        var settings: [String: String] = [
            "bootstrap.servers": bootstrapServers,
            "enable.idempotence": "true",
            "acks": "all",
            "linger.ms": "5",
            "message.timeout.ms": "300000",
            "queue.buffering.max.messages": "100000",
        ]
        settings.merge(properties) { _, given in given }
        let builder = try KafkaConfigBuilder(settings)
        let callbacks = ProducerCallbacks(logger: logger)
        callbacks.install(on: builder)
        builder.withConf { conf in
            rd_kafka_conf_set_dr_msg_cb(conf, deliveryReport)
            rd_kafka_conf_set_error_cb(conf, producerError)
        }
        self.handle = try KafkaHandle(type: RD_KAFKA_PRODUCER, configuration: builder, context: callbacks)
        self.callbacks = callbacks
        self.topics = Locked([:])
        self.logger = logger
    }

    deinit {
        poller.withLock { $0 }?.stop()
    }

    /// Starts the poll thread that serves delivery reports, once.
    public func start() {
        guard !polling.load(ordering: .acquiring) else { return }
        poller.withLock { poller in
            guard poller == nil, !closed.load(ordering: .relaxed) else { return }
            let handle = self.handle
            let callbacks = self.callbacks
            poller = PollThread(name: "kafka-producer-poll") {
                handle.withHandle { _ = rd_kafka_poll($0, 100) }
                callbacks.dispatchBatches()
            }
            polling.store(true, ordering: .releasing)
        }
    }

    /// Serves delivery reports until a graceful shutdown (or cancellation), then
    /// ``close(timeout:)``s: what is handed over gets up to 10 s to be delivered.
    public func run() async {
        start()
        await waitForGracefulShutdown(orUntil: closedLatch)
        await close()
    }

    /// Asks the cluster for `topics` now (their partitions and leaders), each until `timeout`,
    /// and keeps their handles: the first record of each then goes straight to its leader. A
    /// topic first met by a record waits for a metadata request, and librdkafka sends that on a
    /// connection already in use, where it waits behind whatever that broker is slow to answer
    /// (another topic's produce request, say). Returns each topic's partition count; throws for
    /// the first topic not known by the deadline.
    @discardableResult
    public func prepare(topics names: [String], timeout: Duration = .seconds(10)) async throws(KafkaError) -> [String: Int] {
        for name in names { _ = try topic(name) }
        let deadline = ContinuousClock.now + timeout, handle = self.handle
        return try await runBlocking {
            Result { () throws(KafkaError) -> [String: Int] in
                var counts: [String: Int] = [:]
                for name in names { counts[name] = try handle.partitionCount(of: name, deadline: deadline) }
                return counts
            }
        }.get()
    }

    /// Appends a record and waits for its delivery report.
    ///
    /// Throws when librdkafka refuses the record at once (its local queue is full:
    /// ``KafkaError/queueFullCode``, retriable) or when the delivery report carries an error.
    /// A nil `value` is a null value: a tombstone on a compacted topic. `partition`: that one,
    /// not the partitioner's choice for `key`.
    public func send(topic: String, partition: Int32? = nil, key: [UInt8]?, value: [UInt8]?,
                     headers: [KafkaHeader] = []) async throws(KafkaError) -> Delivery {
        let result: Result<Delivery, KafkaError> = await withUnsafeContinuation { continuation in
            send(topic: topic, partition: partition, key: key, value: value, headers: headers) { continuation.resume(returning: $0) }
        }
        return try result.get()
    }

    /// Hands the record over now; `report` hears its delivery report (on librdkafka's poll
    /// thread, or at once when the record is refused). For callers that chain the report into
    /// work of their own instead of waiting for it.
    public func send(topic: String, partition: Int32? = nil, key: [UInt8]?, value: [UInt8]?, headers: [KafkaHeader] = [],
                     report: @escaping @Sendable (Result<Delivery, KafkaError>) -> Void) {
        guard !closed.load(ordering: .relaxed) else {
            return report(.failure(KafkaError(code: RD_KAFKA_RESP_ERR__DESTROY.rawValue, message: "the producer is closed")))
        }
        start()
        let topicHandle: TopicHandle
        do {
            topicHandle = try self.topic(topic)
        } catch {
            return report(.failure(error))
        }
        Self.produce(topicHandle, partition: partition ?? RD_KAFKA_PARTITION_UA, key: key, value: value, headers: headers,
                     to: DeliveryCallback(report), topic: topic)
    }

    /// A batcher whose records' delivery reports reach `handler` a poll at a time
    /// (``DeliveryReportBatcher``); nil: set one later with ``DeliveryReportBatcher/deliver(to:)``.
    /// The producer keeps it as long as itself (every report it serves is handed over), so a
    /// handler that needs its maker holds it weakly. At most 32,768 per producer.
    public func reportBatcher(_ handler: (@Sendable ([DeliveryReportBatcher.Report]) -> Void)? = nil) -> DeliveryReportBatcher {
        callbacks.batchers.withLock { batchers in
            precondition(batchers.count < BatchedOpaque.batchers, "at most \(BatchedOpaque.batchers) report batchers per producer")
            let batcher = DeliveryReportBatcher(index: batchers.count, owner: ObjectIdentifier(callbacks), handler)
            batchers.append(batcher)
            return batcher
        }
    }

    /// Hands the record over now; `batcher` hears its delivery report with `slot` (0 to 2^47 - 1,
    /// the caller's name for the record), in a batch with the others one poll served (or at
    /// once, alone, when the record is refused). Allocates nothing for the report: the slot and
    /// the batcher travel in the record's opaque pointer. `batcher` must be this producer's
    /// (``reportBatcher(_:)``).
    public func send(topic: String, partition: Int32? = nil, key: [UInt8]?, value: [UInt8]?,
                     headers: [KafkaHeader] = [], slot: Int, to batcher: DeliveryReportBatcher) {
        precondition(batcher.owner == ObjectIdentifier(callbacks), "a report batcher takes the records of the producer that made it")
        guard !closed.load(ordering: .relaxed) else {
            return batcher.refused(slot, KafkaError(code: RD_KAFKA_RESP_ERR__DESTROY.rawValue, message: "the producer is closed"))
        }
        start()
        let topicHandle: TopicHandle
        do {
            topicHandle = try self.topic(topic)
        } catch {
            return batcher.refused(slot, error)
        }
        if let failure = Self.produce(topicHandle, partition: partition ?? RD_KAFKA_PARTITION_UA, key: key, value: value, headers: headers,
                                      opaque: BatchedOpaque.make(batcher: batcher.index, slot: slot), topic: topic) {
            batcher.refused(slot, failure)
        }
    }

    /// Appends the records in the order given (records for one partition keep it) and waits for
    /// all their delivery reports; the first failure throws.
    public func send(topic: String, records: [(key: [UInt8]?, value: [UInt8])]) async throws(KafkaError) -> [Delivery] {
        guard !closed.load(ordering: .relaxed) else {
            throw KafkaError(code: RD_KAFKA_RESP_ERR__DESTROY.rawValue, message: "the producer is closed")
        }
        guard !records.isEmpty else { return [] }
        start()
        let topicHandle = try self.topic(topic)
        let results: [Result<Delivery, KafkaError>] = await withUnsafeContinuation { continuation in
            let collector = DeliveryCollector(count: records.count, continuation)
            for (index, record) in records.enumerated() {
                Self.produce(topicHandle, key: record.key, value: record.value, to: CollectedDelivery(collector, index), topic: topic)
            }
        }
        return try results.map { result throws(KafkaError) in try result.get() }
    }

    /// Hands one record to librdkafka; `target` hears its delivery report (at once when
    /// librdkafka refuses the record).
    private static func produce(_ topicHandle: TopicHandle, partition: Int32 = RD_KAFKA_PARTITION_UA, key: [UInt8]?, value: [UInt8]?,
                                headers: [KafkaHeader] = [], to target: DeliveryTarget, topic: String) {
        // Retained here, released by the delivery report (or below when produce fails).
        let opaque = Unmanaged.passRetained(target).toOpaque()
        if let failure = produce(topicHandle, partition: partition, key: key, value: value, headers: headers, opaque: opaque, topic: topic) {
            Unmanaged<DeliveryTarget>.fromOpaque(opaque).release()
            target.refused(failure)
        }
    }

    /// Hands one record to librdkafka with `opaque` for its delivery report; why librdkafka
    /// refused it at once, or nil.
    private static func produce(_ topicHandle: TopicHandle, partition: Int32, key: [UInt8]?, value: [UInt8]?,
                                headers: [KafkaHeader], opaque: UnsafeMutableRawPointer, topic: String) -> KafkaError? {
        guard headers.isEmpty else {
            return produceWithHeaders(topicHandle, partition: partition, key: key, value: value, headers: headers, opaque: opaque, topic: topic)
        }
        let produced = withOptionalBytes(value) { valueBytes in
            withOptionalBytes(key) { keyBytes in
                rd_kafka_produce(
                    topicHandle.pointer, partition, RD_KAFKA_MSG_F_COPY,
                    valueBytes.flatMap { UnsafeMutableRawPointer(mutating: $0.baseAddress) }, valueBytes?.count ?? 0,
                    keyBytes?.baseAddress, keyBytes?.count ?? 0, opaque)
            }
        }
        return produced == 0 ? nil : KafkaError(rd_kafka_last_error(), context: "produce to \(topic)")
    }

    /// Waits until every record handed over has its delivery report, or the timeout passes.
    /// Returns false on timeout. Runs on its own thread.
    public func flush(timeout: Duration) async -> Bool {
        let milliseconds = Int32(clamping: timeout.totalMilliseconds)
        let handle = self.handle
        let callbacks = self.callbacks
        return await runBlocking {
            // Batched reports the flush served are handed over at its end (or at the poll
            // thread's next turn, which also serves them, whichever comes first).
            defer { callbacks.dispatchBatches() }
            return handle.withHandle { rd_kafka_flush($0, milliseconds) } == RD_KAFKA_RESP_ERR_NO_ERROR
        }
    }

    /// Flushes for up to `timeout`, then fails whatever is still undelivered (its `send` throws)
    /// and stops the poll thread. The producer is unusable afterwards.
    /// Later calls wait for the first one to finish.
    public func close(timeout: Duration = .seconds(10)) async {
        guard !closed.exchange(true, ordering: .relaxed) else {
            _ = await closedLatch.wait()
            return
        }
        let flushed = await flush(timeout: timeout)
        let handle = self.handle
        let poller = self.poller.withLock { $0 }
        let callbacks = self.callbacks
        await runBlocking {
            handle.withHandle { rk in
                _ = rd_kafka_purge(rk, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
                // Serves the purged records' delivery reports.
                _ = rd_kafka_flush(rk, 1000)
            }
            poller?.stop()
            callbacks.dispatchBatches()
        }
        logger.info(flushed ? "producer closed: every record delivered" : "producer closed: undelivered records failed")
        closedLatch.open()
    }

    /// Fails every record not delivered yet, queued or in flight: each one's delivery report
    /// comes at once (from the poll thread) with `_PURGE_QUEUE` or `_PURGE_INFLIGHT`, instead of
    /// when `message.timeout.ms` passes. The producer stays usable. For a stop past its deadline:
    /// what still waits for Kafka is given up, not waited for.
    public func purge() {
        guard !closed.load(ordering: .relaxed) else { return }
        handle.withHandle { _ = rd_kafka_purge($0, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING)) }
    }

    /// Records waiting for their delivery report.
    public var outstanding: Int {
        handle.withHandle { Int(rd_kafka_outq_len($0)) }
    }

    /// Hands each of librdkafka's statistics to `handler` (from the poll thread), every
    /// `statistics.interval.ms` (0, librdkafka's default, emits none).
    public func onStatistics(_ handler: @escaping @Sendable (KafkaStatistics) -> Void) {
        callbacks.statistics.set(handler)
    }

    /// A fatal producer error (idempotence broken), if one happened.
    public var fatalError: KafkaError? { callbacks.fatal.withLock { $0 } }

    private func topic(_ name: String) throws(KafkaError) -> TopicHandle {
        let result: Result<TopicHandle, KafkaError> = topics.withLock { topics in
            if let existing = topics[name] { return .success(existing) }
            guard let topic = handle.topic(name) else {
                return .failure(KafkaError(rd_kafka_last_error(), context: "topic \(name)"))
            }
            topics[name] = topic
            return .success(topic)
        }
        return try result.get()
    }
}

/// Owns an `rd_kafka_topic_t`, and keeps its client alive until the topic is destroyed.
/// `@unchecked Sendable`: `pointer` and `client` are `let`s; librdkafka's topic handles are
/// thread-safe (any thread produces through `pointer`).
final class TopicHandle: @unchecked Sendable {
    let pointer: OpaquePointer
    let client: KafkaHandle
    init(_ pointer: OpaquePointer, client: KafkaHandle) {
        self.pointer = pointer
        self.client = client
    }
    deinit { rd_kafka_topic_destroy(pointer) }
}

/// Where a delivery report goes.
private class DeliveryTarget {
    /// The delivery report, on the thread that polled.
    func report(_ result: Result<KafkaProducer.Delivery, KafkaError>) {}
    /// librdkafka refused the record at once: on the sending thread.
    func refused(_ error: KafkaError) {
        report(.failure(error))
    }
}

/// One `send`'s report.
private final class DeliveryCallback: DeliveryTarget {
    let callback: @Sendable (Result<KafkaProducer.Delivery, KafkaError>) -> Void
    init(_ callback: @escaping @Sendable (Result<KafkaProducer.Delivery, KafkaError>) -> Void) {
        self.callback = callback
    }

    override func report(_ result: Result<KafkaProducer.Delivery, KafkaError>) {
        callback(result)
    }
}

/// Gathers the delivery reports of a batch of records; resumes its task with the last one.
private final class DeliveryCollector: Sendable {
    private let state: Locked<(results: [Result<KafkaProducer.Delivery, KafkaError>?], missing: Int)>
    private let continuation: UnsafeContinuation<[Result<KafkaProducer.Delivery, KafkaError>], Never>

    init(count: Int, _ continuation: UnsafeContinuation<[Result<KafkaProducer.Delivery, KafkaError>], Never>) {
        self.state = Locked((Array(repeating: nil, count: count), count))
        self.continuation = continuation
    }

    func set(_ index: Int, _ result: Result<KafkaProducer.Delivery, KafkaError>) {
        let finished = state.withLock { state -> [Result<KafkaProducer.Delivery, KafkaError>]? in
            state.results[index] = result
            state.missing -= 1
            return state.missing == 0 ? state.results.map { $0! } : nil
        }
        if let finished { continuation.resume(returning: finished) }
    }
}

private final class CollectedDelivery: DeliveryTarget {
    let collector: DeliveryCollector
    let index: Int
    init(_ collector: DeliveryCollector, _ index: Int) {
        self.collector = collector
        self.index = index
    }

    override func report(_ result: Result<KafkaProducer.Delivery, KafkaError>) {
        collector.set(index, result)
    }
}

/// State the C callbacks reach through the configuration's opaque pointer.
/// `@unchecked Sendable`: its one property, `fatal`, is a `Locked` (written by the error
/// callback on librdkafka's thread, read by the application's calls).
final class ProducerCallbacks: KafkaCallbackContext, @unchecked Sendable {
    let fatal = Locked<KafkaError?>(nil)
    /// The producer's report batchers (``KafkaProducer/reportBatcher(_:)``), by index.
    let batchers = Locked<[DeliveryReportBatcher]>([])

    /// Hands each batcher the reports the last poll (or flush) served it.
    func dispatchBatches() {
        for batcher in batchers.withLock({ $0 }) { batcher.dispatch() }
    }
}

private let deliveryReport: @convention(c) (OpaquePointer?, UnsafePointer<rd_kafka_message_t>?, UnsafeMutableRawPointer?) -> Void = { _, message, callbacks in
    guard let message, let opaque = message.pointee._private else { return }
    let result: Result<KafkaProducer.Delivery, KafkaError> = message.pointee.err == RD_KAFKA_RESP_ERR_NO_ERROR
        ? .success(.init(partition: message.pointee.partition, offset: message.pointee.offset))
        : .failure(KafkaError(message.pointee.err, context: "delivery"))
    if let (batcher, slot) = BatchedOpaque.split(opaque) {
        // A batched record: its batcher among the producer's (the callbacks are the
        // configuration's opaque).
        guard let callbacks else { return }
        let producer = Unmanaged<ProducerCallbacks>.fromOpaque(callbacks).takeUnretainedValue()
        producer.batchers.withLock { $0.indices.contains(batcher) ? $0[batcher] : nil }?.append(slot, result)
        return
    }
    Unmanaged<DeliveryTarget>.fromOpaque(opaque).takeRetainedValue().report(result)
}

private let producerError: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = { handle, code, reason, opaque in
    guard let opaque else { return }
    let callbacks = Unmanaged<ProducerCallbacks>.fromOpaque(opaque).takeUnretainedValue()
    let text = reason.map { String(cString: $0) } ?? "unknown"
    if code == RD_KAFKA_RESP_ERR__FATAL.rawValue, let handle {
        var fatalText = [CChar](repeating: 0, count: 512)
        let fatalCode = rd_kafka_fatal_error(handle, &fatalText, fatalText.count)
        let error = KafkaError(code: fatalCode.rawValue, message: string(fromCBuffer: fatalText), isFatal: true)
        callbacks.fatal.withLock { $0 = error }
        callbacks.logger.critical("Kafka producer hit a fatal error", metadata: ["kafka.error": "\(error)"])
    } else {
        callbacks.logger.warning("Kafka producer error", metadata: ["kafka.error": "\(text)", "kafka.code": "\(code)"])
    }
}

func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}
