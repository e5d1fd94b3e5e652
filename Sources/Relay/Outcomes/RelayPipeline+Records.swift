import Common
import Kafka
import Redis

extension RelayPipeline {
    /// Records what needs recording, publishes the outcome (and its invalidation record, if
    /// any) and ends the item.
    @inline(never)
    func conclude(_ item: WorkItem, _ ending: Ending) async {
        // The outcome stays in `ending` (this frame, held by every intent in flight, stays small).
        guard let status = ending.outcome?.status else {
            finish(item, stored: ending.parked, sent: ending.countedAtAPNs)
            return
        }
        // Any invalidation record goes out beside the outcome; the offset is stored once both are.
        // With Redis a tombstone waits for the delivery's record (the device's last
        // notification): a relay whose dead record for the pair lands after this tombstone
        // then finds the delivery (``deliveredSince(_:)``) and follows it with a tombstone.
        let deferred = deduplicator != nil && Self.isTombstone(ending)
        let early = deferred ? nil : startInvalidation(ending)
        guard await recordAndPublish(item, ending, records: Self.records(item, status, dedupe: deduplicator != nil)) else {
            finish(item, stored: false, sent: ending.countedAtAPNs)
            return
        }
        // An item counted in `answering` is marked when its slot is freed (``freeSlot(of:_:_:)``).
        if status == .coalesced, !item.holdsAnswer, deduplicator != nil, case .success(let intent) = item.intent {
            await recordedCoalesced(intent, in: shard(of: item))
        }
        if let invalidation = early ?? (deferred ? startInvalidation(ending) : nil), await !invalidationDelivered(invalidation, ending, item) {
            finish(item, stored: false, sent: ending.countedAtAPNs)
            return
        }
        if let member = item.mailboxMember { await release(member, item) }
        finish(item, stored: true, sent: ending.countedAtAPNs)
    }

    /// Whether the ending's invalidation record is a tombstone (a delivery, or a duplicate of one).
    static func isTombstone(_ ending: Ending) -> Bool {
        guard let outcome = ending.outcome, let record = Invalidation.record(for: outcome) else { return false }
        return record.value == nil
    }

    /// Records the answer first when `records`, then publishes the outcome. False when the
    /// item's partition was revoked before the outcome was out, or the shutdown deadline passed
    /// before the record was in (``Chained/abandoned``).
    @inline(never)
    func recordAndPublish(_ item: WorkItem, _ ending: Ending, records: Bool) async -> Bool {
        if records {
            // Usually one wait for both: the record's round trip, then the outcome's report.
            switch await recordThenPublish(item, ending) {
            case .published:
                published(ending, item)
                return true
            case .notRecorded:
                await record(item, ending)
            case .notPublished(let error):
                publishFailed(item, error)
            case .abandoned:
                return false
            }
        }
        return await publish(ending, item)
    }

    /// Statuses that mean APNs gave a final answer: those are recorded for dedupe.
    static func isAnswered(_ status: Outcome.Status) -> Bool {
        status == .delivered || status == .rejected || status == .unregistered
    }

    /// Whether the item's answer is recorded for dedupe before its outcome goes out: APNs'
    /// final answer to the item that records it, and a `coalesced` answer (a redelivery of the
    /// superseded intent then comes out `duplicate` instead of being sent after the newer one;
    /// written only where no record is, ``Deduplicator/record(token:topic:id:status:window:lastSent:unregistered:onlyIfAbsent:then:)``).
    static func records(_ item: WorkItem, _ status: Outcome.Status, dedupe: Bool) -> Bool {
        (item.recordsAnswer && isAnswered(status)) || (dedupe && status == .coalesced)
    }

    enum Chained: Sendable {
        case published
        /// Redis failed the record (reported here): record with retries, then publish.
        case notRecorded
        /// Recorded, but the outcome's delivery failed: publish with retries.
        case notPublished(KafkaError)
        /// Recorded past the shutdown deadline: the outcome is not handed to the producer (which
        /// may be closing); the item is abandoned, its offset not stored.
        case abandoned
    }

    /// Records the answered intent and, once Redis has it, hands its outcome to the producer
    /// from the record's callback (``GroupCommit``), so the item waits once for both.
    @inline(never)
    func recordThenPublish(_ item: WorkItem, _ ending: Ending) async -> Chained {
        await withCheckedContinuation { continuation in
            recordThenPublish(item, ending) { continuation.resume(returning: $0) }
        }
    }

    /// ``recordThenPublish(_:_:)`` with a callback (its continuation): `done` hears how it went,
    /// on the producer's poll thread once the outcome's delivery report is in, or from the Redis
    /// call when the record failed (reported here).
    func recordThenPublish(_ item: WorkItem, _ ending: Ending, done: @escaping @Sendable (Chained) -> Void) {
        let outcomes = self.outcomes
        record(item, ending, orElse: done) { key, value, headers in
            outcomes.send(key: key, value: value, headers: headers) { delivered in
                if case .failure(let error) = delivered { return done(.notPublished(error)) }
                done(.published)
            }
        }
    }

    /// Records the answered intent and, once Redis has it, calls `publish` with the outcome's
    /// record (key, value, headers) from the Redis call's callback (on the loop the record was
    /// made on, ``GroupCommit``; off the loops, the first shard's); `orElse` hears when it did not
    /// get that far: `notRecorded` (Redis failed the record, reported here) or `abandoned` (past
    /// the shutdown deadline).
    func record(_ item: WorkItem, _ ending: Ending, orElse: @escaping @Sendable (Chained) -> Void,
                then publish: @escaping @Sendable ([UInt8]?, [UInt8], [KafkaHeader]) -> Void) {
        guard let deduplicator, case .success(let intent) = item.intent, let (status, window) = recordFields(ending),
              let (key, value) = Self.encoded(ending) else { return orElse(.notRecorded) }
        let started = ContinuousClock.now
        let headers = Self.outgoingHeaders(item), traced = item.traced, unregistered = unregisteredChange(item, ending)
        deduplicator.record(token: intent.recipient, topic: intent.topic, id: intent.id, status: status, window: window,
                            lastSent: ending.lastSent, unregistered: unregistered,
                            onlyIfAbsent: ending.outcome?.status == .coalesced) { recorded in
            if case .failure(let error) = recorded {
                self.health.redisFailed(error)
                return orElse(.notRecorded)
            }
            RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - started).totalNanoseconds)
            if self.abandoning.isOpen { return orElse(.abandoned) }
            traced?.publishBegins()
            publish(key, value, headers)
        }
    }

    /// Records the answered intent in Redis before its outcome is published (so a redelivery
    /// of it is a duplicate). Retries while Redis fails, unless `redis.fail_open`.
    @inline(never)
    func record(_ item: WorkItem, _ ending: Ending) async {
        guard let deduplicator, case .success(let intent) = item.intent, let (status, window) = recordFields(ending) else { return }
        _ = await withRedisRetries(item) { () throws(RedisError) in
            try await deduplicator.record(token: intent.recipient, topic: intent.topic, id: intent.id, status: status, window: window,
                                          lastSent: ending.lastSent, unregistered: unregisteredChange(item, ending),
                                          onlyIfAbsent: ending.outcome?.status == .coalesced)
        }
    }

    /// The answer to record (``AnswerRecord``) and for how long (kept out of `record`'s frame).
    @inline(never)
    func recordFields(_ ending: Ending) -> (AnswerRecord, Int64)? {
        guard let outcome = ending.outcome else { return nil }
        return (AnswerRecord(outcome), configuration.policy.rules(for: outcome.topic ?? "").dedupeWindowSeconds)
    }

    /// What the answer changes in the pair's remembered 410: with `policy.skip_known_unregistered`
    /// APNs' 410 is remembered (its timestamp); a delivery forgets it whether the option is on
    /// or not (so that turning it off and on again, or relays of an older version during an
    /// upgrade, leave no 410 behind that a delivery since contradicts) — unless the option is
    /// off and the intent's admission read the pair and found none
    /// (``WorkItem/forgetsUnregistered``): then there is nothing to delete, and most deliveries
    /// send Redis one command fewer. A `KnownUnregistered`
    /// answer (no request was made) changes nothing: the 410 keeps its own lifetime. A channel
    /// has no 410 to remember.
    @inline(never)
    func unregisteredChange(_ item: WorkItem, _ ending: Ending) -> Deduplicator.Unregistered? {
        guard let outcome = ending.outcome, outcome.channelID == nil else { return nil }
        switch outcome.status {
        case .unregistered where outcome.httpStatus == 410 && configuration.policy.skipKnownUnregistered:
            return .remember(at: outcome.unregisteredAt ?? outcome.at, ttl: configuration.policy.knownUnregisteredTTLSeconds)
        case .delivered:
            return item.forgetsUnregistered ? .forget : nil
        default:
            return nil
        }
    }
}
