import Common
import Kafka
import Redis

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
    ///
    /// A dead record that is out is followed by a tombstone when APNs accepted a notification
    /// for the pair after this 410 was decided (``deliveredSince(_:)``): another relay's
    /// delivery, whose tombstone may have landed before this record (records of one key from
    /// two producers land in no order the relays choose). The compacted topic then ends with a
    /// tombstone, as it would had the records landed in the order of the answers.
    @inline(never)
    func invalidationDelivered(_ pending: PendingDelivery, _ ending: Ending, _ item: WorkItem) async -> Bool {
        guard let outcome = ending.outcome, let (key, value) = Invalidation.record(for: outcome) else { return true }
        if case .failure(let error) = await pending.report() {
            invalidationFailed(item, error)
            guard await publishInvalidation(key: key, value: value, item) else { return false }
        }
        (value == nil ? RelayMetrics.tombstonesPublished : RelayMetrics.invalidationsPublished).increment()
        if value != nil, await deliveredSince(outcome) {
            logger.info("the pair was delivered to after this 410: its dead record is followed by a tombstone",
                        metadata: metadata(item, [:]))
            guard await publishInvalidation(key: key, value: nil, item) else { return false }
            RelayMetrics.tombstonesPublished.increment()
        }
        return true
    }

    /// Publishes an invalidation record (or tombstone), with backoff while it fails, as long as
    /// the item's partition is held. False when it was given up.
    private func publishInvalidation(key: [UInt8], value: [UInt8]?, _ item: WorkItem) async -> Bool {
        let topic = configuration.kafka.invalidationsTopic
        let sent: Void? = await Retry(backoff: backoff).run { () async throws(KafkaError) in
            _ = try await producer.send(topic: topic, key: key, value: value)
        } failed: { error, _ in
            invalidationFailed(item, error)
            return isCurrent(item) ? .retry : .giveUp
        }
        return sent != nil
    }

    /// Whether Redis holds a notification APNs accepted for `outcome`'s pair (the device's
    /// last one, ``DeviceRecords/LastSent``) decided after `outcome` was. A relay records a
    /// delivery before it publishes its outcome and tombstone, so a tombstone that landed
    /// before a dead record published after it is seen here. Without Redis, or when Redis
    /// cannot say (an error, an unreadable record: logged), false: the dead record stands
    /// until the pair's next delivery (docs/invalidations.md).
    func deliveredSince(_ outcome: Outcome) async -> Bool {
        guard let redis, let keys = policy?.keys, let token = outcome.token, let topic = outcome.topic else { return false }
        let reply: RESPValue
        do {
            reply = try await redis.send(RedisCommand("GET", [keys.lastSent(token: token, topic: topic)]))
        } catch {
            RelayMetrics.redisError(error)
            logger.warning("cannot tell whether the pair was delivered to after its 410: its dead record stands",
                           metadata: ["redis.error": "\(error)", "intent.id": "\(outcome.id ?? "")"])
            return false
        }
        guard let bytes = reply.bytes else { return false }
        guard let at = DeviceRecords.lastSentTime(bytes) else {
            logger.warning("the pair's last delivery record is unreadable: its dead record stands", metadata: ["intent.id": "\(outcome.id ?? "")"])
            return false
        }
        // A duplicate's own time is its redelivery's, not the 410's: compared with APNs'
        // timestamp of the 410 instead, the latest time the token is known dead at.
        return at > (outcome.status == .duplicate ? outcome.unregisteredAt ?? outcome.at : outcome.at)
    }

    /// An invalidation record's delivery failed (it is tried again).
    func invalidationFailed(_ item: WorkItem, _ error: KafkaError) {
        logger.warning("invalidation record not published yet", metadata: metadata(item, ["kafka.error": "\(error)"]))
        RelayMetrics.publishFailures.increment()
        health.publishFailed()
    }
}
