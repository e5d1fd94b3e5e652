import Logging
import Common
import APNs
import Kafka
import Redis

extension RelayPipeline {
    /// How an item ended: its outcome (nil when its work was abandoned, its partition revoked)
    /// and, when APNs accepted it, the device's last-notification record. A class, so the async
    /// frames on the way hold a reference, not the outcome.
    /// `@unchecked Sendable`: as ``Delivery``, one step of its intent touches it at a time.
    /// Not final: a ``Delivery`` is its own ending (one object per sent intent, not two).
    class Ending: @unchecked Sendable {
        var outcome: Outcome?
        var lastSent: DeviceRecords.LastSent?
        /// In its device's mailbox: no outcome now (the mailbox answers it later), and its
        /// offset may be committed.
        var parked: Bool
        /// Counted among its partition's work at APNs (``PartitionLedger/sendBegins(_:generation:first:)``)
        /// until it ends.
        var countedAtAPNs = false

        init(outcome: Outcome? = nil, parked: Bool = false) {
            self.outcome = outcome
            self.parked = parked
        }
    }

    /// How an intent that is not sent ends. A coalesced intent's badge change still counts
    /// (the newer notification shows the sum).
    @inline(never)
    func earlyEnding(_ item: WorkItem) async -> Ending {
        if case .inMailbox = item.admission { return await inMailbox(item) }
        var outcome = earlyOutcome(item, item.admission)
        if case .coalesced = item.admission, case .success(let intent) = item.intent, let change = intent.badge, let badges {
            outcome.badge = await withRedisRetries(item) { () throws(RedisError) in
                try await badges.apply(change, intentID: intent.id, token: intent.token, topic: intent.topic)
            }
        }
        return Ending(outcome: outcome)
    }

    /// A redelivered intent its device's mailbox already holds: parked, once its due-index
    /// member is known to exist (written again if the park's index write never happened).
    /// Redis failing with `redis.fail_open` leaves it parked unchecked; the partition gone
    /// meanwhile abandons it (its next owner consumes it again).
    @inline(never)
    func inMailbox(_ item: WorkItem) async -> Ending {
        guard let policy, case .success(let intent) = item.intent else { return Ending(parked: true) }
        let now = nowMilliseconds()
        let indexed: Void? = await withRedisRetries(item) { () throws(RedisError) in
            try await policy.ensureIndexed(partition: item.partition, token: intent.recipient, topic: intent.topic,
                                           id: intent.id, now: now)
        }
        if indexed != nil { await handOverDisplaced(token: intent.recipient, topic: intent.topic, keeper: intent.id, item, policy) }
        return indexed != nil || (isCurrent(item) && !Task.isCancelled) ? Ending(parked: true) : Ending()
    }

    /// The outcome of an unusable message or of an intent the policy keeps from being sent.
    @inline(never)
    func earlyOutcome(_ item: WorkItem, _ admission: Admission) -> Outcome {
        let intent: Intent
        switch item.intent {
        case .failure(let invalid): return invalidOutcome(item, invalid)
        case .success(let usable): intent = usable
        }
        switch admission {
        case .coalesced(let newer):
            var outcome = makeOutcome(item, intent: intent, status: .coalesced, reason: "Superseded")
            outcome.supersededBy = newer
            return outcome
        case .nowOrNever:
            return makeOutcome(item, intent: intent, status: .expired, reason: "RateLimited")
        case .expiredParked:
            return makeOutcome(item, intent: intent, status: .expired, reason: "ExpiredWhileParked")
        case .recipientBacklog:
            return makeOutcome(item, intent: intent, status: .failed, reason: "RecipientBacklog")
        case .knownUnregistered(let at):
            var outcome = makeOutcome(item, intent: intent, status: .unregistered, reason: Invalidation.knownUnregisteredReason)
            outcome.unregisteredAt = at
            return outcome
        case .duplicate(let record?):
            // What APNs answered the first time: a 410 reported again with its timestamp.
            var outcome = makeOutcome(item, intent: intent, status: .duplicate, reason: record.reason ?? "AlreadyAnswered")
            outcome.originalStatus = record.status
            outcome.httpStatus = record.httpStatus
            outcome.apnsID = record.apnsID
            outcome.unregisteredAt = record.unregisteredAt
            return outcome
        case .duplicate(nil), .send, .park, .inMailbox, .readmit:
            return makeOutcome(item, intent: intent, status: .duplicate, reason: "AlreadyAnswered")
        }
    }

    func invalidOutcome(_ item: WorkItem, _ invalid: InvalidIntent) -> Outcome {
        logger.debug("invalid intent", metadata: metadata(item, ["intent.reason": "\(invalid.reason)"]))
        var outcome = makeOutcome(item, id: invalid.id, token: invalid.token, topic: invalid.topic, status: .invalid,
                                  reason: "\(invalid.reason): \(invalid.message)")
        outcome.channelID = invalid.channelID
        outcome.metadata = invalid.metadata
        outcome.redrive = invalid.redrive
        outcome.policyDecision = item.policyDecision
        return outcome
    }

    func makeOutcome(_ item: WorkItem, intent: Intent, status: Outcome.Status, result: APNsResult? = nil,
                             reason: String? = nil, attempts: Int = 0) -> Outcome {
        var outcome = makeOutcome(item, id: intent.id, token: intent.channelID == nil ? intent.token : nil, topic: intent.topic,
                                  status: status, reason: reason ?? result?.reason?.description ?? result?.failure.map { "\($0)" })
        outcome.channelID = intent.channelID
        outcome.apnsUniqueID = result?.uniqueID
        outcome.httpStatus = result?.status
        outcome.apnsID = result?.apnsID ?? APNsIdentifiers.format(Intent.apnsID(for: intent.id))
        outcome.unregisteredAt = status == .unregistered ? result?.timestamp : nil
        outcome.attempts = attempts
        outcome.metadata = intent.metadata
        outcome.collapseID = intent.collapseID
        outcome.redrive = intent.redrive
        outcome.policyDecision = item.policyDecision
        return outcome
    }

    func makeOutcome(_ item: WorkItem, id: String?, token: String?, topic: String?, status: Outcome.Status,
                             reason: String?) -> Outcome {
        let elapsed = ContinuousClock.now - item.consumedAt
        // An intent taken from a mailbox names where it came from, not the due index it was
        // found in (an entry can wait in another lane's index of its device).
        let origin = item.origin ?? item.partition
        return Outcome(id: id, token: token, topic: topic, status: status, reason: reason, attempts: 0,
                       latencyMilliseconds: elapsed.totalMilliseconds, lane: origin.topic,
                       partition: origin.partition, offset: item.offset, worker: worker,
                       at: APNsIdentifiers.epochMilliseconds())
    }

    /// Publishes until the delivery report succeeds (retrying with backoff). False when the
    /// item's partition was revoked meanwhile, or its work is abandoned (past the shutdown
    /// deadline, ``abandoning``: nothing more is handed to the producer, which may be closing):
    /// the outcome may not be out.
    ///
    /// `carriesTrace`: the outcome is `item`'s (its trace headers and spans); false for an
    /// outcome published on another intent's behalf.
    @inline(never)
    func publish(_ ending: Ending, _ item: WorkItem, carriesTrace: Bool = true) async -> Bool {
        guard !abandoning.isOpen, let (key, value) = Self.encoded(ending) else { return false }
        let headers = carriesTrace ? Self.outgoingHeaders(item) : []
        if carriesTrace { item.traced?.publishBegins() }
        let sent: Void? = await Retry(backoff: backoff).run { () async throws(KafkaError) in
            try await outcomes.send(key: key, value: value, headers: headers)
        } failed: { error, _ in
            publishFailed(item, error)
            return isCurrent(item) ? .retry : .giveUp
        }
        guard sent != nil else { return false }
        published(ending, carriesTrace ? item : nil)
        return true
    }

    /// Before consuming: asks the cluster for the topics the relay produces to (outcomes, and
    /// invalidations when set), so that their first records go straight to their leaders. A
    /// topic first met by a record waits for a metadata request, which librdkafka may send on
    /// a connection where it queues behind a slow broker's answer to another topic's produce.
    /// Bounded by 10 s: a topic not known by then is named in a warning, and the relay goes on
    /// (its records wait and are retried as any whose delivery fails).
    func prepareProducedTopics() async {
        let topics = [configuration.kafka.outcomesTopic, configuration.kafka.invalidationsTopic].filter { !$0.isEmpty }
        do {
            let partitions = try await producer.prepare(topics: topics, timeout: .seconds(10))
            logger.info("topics to produce to are known", metadata: ["kafka.partitions": "\(partitions)"])
        } catch {
            logger.warning("a topic to produce to is not known yet; its records wait", metadata: ["kafka.error": "\(error)"])
        }
    }

    /// An outcome's delivery failed (it is tried again).
    func publishFailed(_ item: WorkItem, _ error: KafkaError) {
        logger.warning("outcome not published yet", metadata: metadata(item, ["kafka.error": "\(error)"]))
        RelayMetrics.publishFailures.increment()
        health.publishFailed()
    }

    /// The outcome as published: key and value (kept out of `publish`'s frame).
    @inline(never)
    static func encoded(_ ending: Ending) -> ([UInt8]?, [UInt8])? {
        guard let outcome = ending.outcome else { return nil }
        return ((outcome.token ?? outcome.channelID).map { Array($0.utf8) }, outcome.utf8)
    }

    /// Counts a published outcome, with its lane's latency and its metrics
    /// (``OutcomePublisher/counted(_:)``); its spans end.
    @inline(never)
    func published(_ ending: Ending, _ item: WorkItem?) {
        guard let outcome = ending.outcome else { return }
        if let item, let traced = item.traced {
            traced.finish(outcome, partition: item.partition.partition, offset: item.offset)
        }
        laneMetrics[item?.lane ?? lane(of: outcome.lane ?? "")].latency.recordMilliseconds(outcome.latencyMilliseconds)
        RelayMetrics.outcome(outcome, topic: outcome.topic.map(metricsTopic) ?? "other")
        outcomes.counted(outcome)
    }
}
