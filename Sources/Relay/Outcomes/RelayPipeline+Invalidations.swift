import Common
import Kafka

extension RelayPipeline {
    /// Hands `ending`'s invalidation record (``Invalidation/record(for:)``) to the producer now,
    /// when `kafka.invalidations_topic` is set and the outcome says something about its token:
    /// its delivery report is awaited once the outcome is out (``invalidationDelivered(_:_:)``),
    /// so the two waits overlap.
    @inline(never)
    func startInvalidation(_ ending: Ending) -> PendingDelivery? {
        let topic = configuration.kafka.invalidationsTopic
        guard !topic.isEmpty, let outcome = ending.outcome, let (key, value) = Invalidation.record(for: outcome) else { return nil }
        return producer.startSending(topic: topic, key: key, value: value)
    }

    /// Waits for the record's delivery report; a failed one is sent again with backoff, as an
    /// outcome is. False when the item's partition was revoked (or its work abandoned) before
    /// the record was out: its offset is not stored, and the intent's next consumer publishes
    /// both again (the outcome then as a `duplicate`, which publishes the record too).
    @inline(never)
    func invalidationDelivered(_ pending: PendingDelivery, _ ending: Ending, _ item: WorkItem) async -> Bool {
        guard let outcome = ending.outcome, let (key, value) = Invalidation.record(for: outcome) else { return true }
        if case .failure(let error) = await pending.report() {
            invalidationFailed(item, error)
            let topic = configuration.kafka.invalidationsTopic
            let sent: Void? = await Retry(backoff: backoff).run { () async throws(KafkaError) in
                _ = try await producer.send(topic: topic, key: key, value: value)
            } failed: { error, _ in
                invalidationFailed(item, error)
                return isCurrent(item) ? .retry : .giveUp
            }
            guard sent != nil else { return false }
        }
        (value == nil ? RelayMetrics.tombstonesPublished : RelayMetrics.invalidationsPublished).increment()
        return true
    }

    /// An invalidation record's delivery failed (it is tried again).
    func invalidationFailed(_ item: WorkItem, _ error: KafkaError) {
        logger.warning("invalidation record not published yet", metadata: metadata(item, ["kafka.error": "\(error)"]))
        RelayMetrics.publishFailures.increment()
        incidents.update { $0.publishFailures += 1 }
    }
}
