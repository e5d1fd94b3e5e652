import Common
import Kafka
import Logging

/// Where outcomes go: the outcomes topic, by the relay's producer. It owns what publishing
/// keeps — the batcher its batched records' delivery reports come through, the count of
/// outcomes published by status, and the hook that hears each one — and nothing of the items
/// the outcomes answer: whether to try again, and what ends when a report comes, are the
/// pipeline's (``RelayPipeline/publish(_:_:carriesTrace:)``, ``RelayPipeline/outcomesDelivered(_:)``).
///
/// Sendable: its properties are `let`s; the tally has its own lock, taken once per outcome and
/// never with another.
final class OutcomePublisher: Sendable {
    let producer: KafkaProducer
    let topic: String
    /// Where batched records' delivery reports come, a poll of the producer at a time
    /// (``deliverReports(to:)``).
    private let reports: DeliveryReportBatcher
    /// Outcomes published so far, by ``Outcome/Status/ordinal``.
    private let tally = Locked(Array(repeating: 0, count: Outcome.Status.allCases.count))
    /// Hears each outcome published (``RelayApplication``'s `published`, for tests and the
    /// benchmarks), on the thread that counted it.
    private let hook: (@Sendable (Outcome) -> Void)?
    private let logger: Logger

    init(producer: KafkaProducer, topic: String, logger: Logger, hook: (@Sendable (Outcome) -> Void)?) {
        self.producer = producer
        self.topic = topic
        self.logger = logger
        self.hook = hook
        self.reports = producer.reportBatcher()
    }

    /// Sets where the batched records' reports go (``sendBatched(key:value:headers:slot:)``).
    func deliverReports(to handler: @escaping @Sendable ([DeliveryReportBatcher.Report]) -> Void) {
        reports.deliver(to: handler)
    }

    /// Hands an outcome over; its delivery report comes with the others of its poll, naming
    /// `slot` (``deliverReports(to:)``).
    func sendBatched(key: [UInt8]?, value: [UInt8], headers: [KafkaHeader], slot: Int) {
        producer.send(topic: topic, key: key, value: value, headers: headers, slot: slot, to: reports)
    }

    /// Hands an outcome over; `report` hears its delivery report (on the producer's poll thread).
    func send(key: [UInt8]?, value: [UInt8], headers: [KafkaHeader],
              report: @escaping @Sendable (Result<KafkaProducer.Delivery, KafkaError>) -> Void) {
        producer.send(topic: topic, key: key, value: value, headers: headers, report: report)
    }

    /// Publishes an outcome and waits for its delivery report.
    func send(key: [UInt8]?, value: [UInt8], headers: [KafkaHeader]) async throws(KafkaError) {
        _ = try await producer.send(topic: topic, key: key, value: value, headers: headers)
    }

    /// Counts a published outcome and hands it to the hook; at debug level, logs it (one line
    /// per outcome: the metadata is built only when debug is on).
    func counted(_ outcome: Outcome) {
        tally.withLock { $0[outcome.status.ordinal] += 1 }
        logger.debug("outcome published", metadata: Self.metadata(outcome))
        hook?(outcome)
    }

    /// Outcomes published so far, by status (those with none left out).
    var counts: [String: Int] {
        let tally = tally.withLock { $0 }
        var counts: [String: Int] = [:]
        for status in Outcome.Status.allCases where tally[status.ordinal] > 0 { counts[status.rawValue] = tally[status.ordinal] }
        return counts
    }

    /// Log metadata naming an outcome (never its token: a device's token is an identifier).
    static func metadata(_ outcome: Outcome) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "intent.id": "\(outcome.id ?? "none")", "outcome.status": "\(outcome.status.rawValue)",
            "kafka.partition": "\(outcome.partition)", "kafka.offset": "\(outcome.offset)",
            "outcome.latency_ms": "\(outcome.latencyMilliseconds)",
        ]
        if let topic = outcome.topic { metadata["apns.topic"] = "\(topic)" }
        if let reason = outcome.reason { metadata["outcome.reason"] = "\(reason)" }
        if let status = outcome.httpStatus { metadata["apns.status"] = "\(status)" }
        if let apnsID = outcome.apnsID { metadata["apns.id"] = "\(apnsID)" }
        return metadata
    }
}
