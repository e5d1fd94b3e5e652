import Common
import APNs
import Redis

extension RelayPipeline {
    /// One intent from consume to outcome. Async functions on this path keep their frames small
    /// (the decisions live in synchronous helpers that are not inlined into them): each frame is
    /// held by every intent in flight.
    @inline(never)
    func handle(_ item: WorkItem) async {
        let ending: Ending
        if case .park(let due) = item.admission, await park(item, due: due) {
            ending = Ending(parked: true)
        } else if let delivery = prepare(item) {
            await send(delivery)
            ending = delivery.ending
        } else {
            ending = await earlyEnding(item)
        }
        await conclude(item, ending)
    }

    /// Badge change (if any), then delivery.
    @inline(never)
    func send(_ delivery: Delivery) async {
        if delivery.intent.badge != nil, await !applyBadge(delivery) { return }
        await deliver(delivery)
        Self.settle(delivery)
    }

    /// Adds the badge sent to the outcome and notes the device's last notification.
    @inline(never)
    static func settle(_ delivery: Delivery) {
        guard var outcome = delivery.ending.outcome else { return }
        outcome.badge = delivery.badge
        delivery.ending.outcome = outcome
        if outcome.status == .delivered {
            delivery.ending.lastSent = DeviceRecords.lastSent(delivery.intent, delivery.notification,
                                                              apnsID: outcome.apnsID, at: outcome.at)
        }
    }

    /// The delivery of a usable intent that is to be sent; nil for the others (see
    /// ``earlyEnding(_:)``).
    @inline(never)
    func prepare(_ item: WorkItem) -> Delivery? {
        guard case .success(let intent) = item.intent else { return nil }
        switch item.admission {
        case .send, .park: return Delivery(intent: intent, item: item, credentialIndex: credentials.index(forTopic: intent.topic))
        default: return nil
        }
    }

    func isCurrent(_ item: WorkItem) -> Bool {
        state.withLock { $0.trackers[item.partition] != nil && $0.generations[item.partition] == item.generation }
    }

    /// One intent's delivery across its attempts.
    final class Delivery {
        let intent: Intent
        let item: WorkItem
        var notification: APNsNotification
        /// The badge count written into the payload, for intents that change it.
        var badge: Int64?
        /// Which credentials send for the intent's topic (nil: none do).
        let credentialIndex: Int?
        let ending = Ending()

        /// Ends the delivery with this outcome (nil: abandoned).
        func finish(_ outcome: Outcome?) -> Step {
            ending.outcome = outcome
            return .finish
        }
        var retryDeadline: Int64 = 0
        var attempts = 0
        var retry = 0
        var lastReason: String?
        /// The last answer, for the outcome when retries run out.
        var lastResult: APNsResult?

        init(intent: Intent, item: WorkItem, credentialIndex: Int?) {
            self.intent = intent
            self.item = item
            self.notification = intent.notification
            self.credentialIndex = credentialIndex
        }
    }

    enum Step {
        /// The outcome is in the delivery's ending.
        case finish
        case send(APNsClient)
        case wait(Duration)
        /// Into the device's mailbox until `due` (epoch ms), after a 429 or past the retry budget.
        case park(due: Int64, tooManyRequests: Bool)
    }

    /// Applies the intent's badge change in Redis (once per intent, retries and redeliveries
    /// included) and writes the count into the payload. False when the delivery ended here
    /// (its ending says how).
    @inline(never)
    func applyBadge(_ delivery: Delivery) async -> Bool {
        guard let change = delivery.intent.badge else { return true }
        let intent = delivery.intent
        guard let badges else {
            delivery.ending.outcome = makeOutcome(delivery.item, intent: intent, status: .failed, reason: "BadgeNeedsRedis")
            return false
        }
        guard let count = await withRedisRetries(delivery.item, { () throws(RedisError) in
            try await badges.apply(change, intentID: intent.id, token: intent.token, topic: intent.topic)
        }) else {
            // Failing open (or refused): the payload goes as it came; revoked: abandoned.
            return isCurrent(delivery.item) && !Task.isCancelled
        }
        delivery.badge = count
        delivery.notification.payload = BadgeStore.payload(delivery.notification.payload, badge: count)
        return true
    }

    /// Sends with retries; the outcome goes to the delivery's ending (nil there when the work
    /// was abandoned, its partition revoked).
    @inline(never)
    func deliver(_ delivery: Delivery) async {
        delivery.retryDeadline = clock() + configuration.retry.deadlineSeconds
        var step = nextAttempt(delivery)
        while true {
            switch step {
            case .finish:
                return
            case .send(let client):
                let sentAt = ContinuousClock.now
                let answer: Result<APNsResult, any Error>
                do {
                    answer = .success(try await client.send(delivery.notification))
                } catch {
                    answer = .failure(error)
                }
                step = judge(answer, delivery, sentAt: sentAt)
            case .wait(let delay):
                do {
                    try await Task.sleep(for: delay)
                    step = nextAttempt(delivery)
                } catch {
                    step = delivery.finish(timeoutOutcome(delivery))
                }
            case .park(let due, let tooManyRequests):
                step = await park(delivery, due: due, tooManyRequests: tooManyRequests)
            }
        }
    }

    /// Parks the delivery's intent in its mailbox; when that cannot be done, the 429 is retried
    /// like any retryable answer and an intent past the retry budget fails.
    @inline(never)
    func park(_ delivery: Delivery, due: Int64, tooManyRequests: Bool) async -> Step {
        if await park(delivery.item, due: due, tooManyRequests: tooManyRequests) {
            delivery.ending.parked = true
            return .finish
        }
        return tooManyRequests ? retryOrGiveUp(delivery) : delivery.finish(timeoutOutcome(delivery))
    }

    /// Whether to send now: not when the partition was revoked, the intent expired or its
    /// team's credentials are in a fault cool-down.
    @inline(never)
    func nextAttempt(_ delivery: Delivery) -> Step {
        let intent = delivery.intent
        let item = delivery.item
        guard isCurrent(item), !Task.isCancelled else { return delivery.finish(nil) }
        guard let credentialIndex = delivery.credentialIndex else {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: "NoCredentials"))
        }
        let now = clock()
        if intent.expiration != 0, now > intent.expiration {
            return delivery.finish(makeOutcome(item, intent: intent, status: .expired, reason: delivery.lastReason ?? "ExpiredBeforeSending",
                                       attempts: delivery.attempts))
        }
        let teamID = configuration.apns.credentials[credentialIndex].teamID
        if let fault = activeCredentialFault(teamID: teamID, now: now) {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: fault, attempts: delivery.attempts))
        }
        do {
            return .send(try client(credentialIndex: credentialIndex, environment: intent.environment))
        } catch {
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, reason: "ClientSetup: \(error)", attempts: delivery.attempts))
        }
    }

    /// What APNs' answer (or the send's error) means for the intent.
    @inline(never)
    func judge(_ answer: Result<APNsResult, any Error>, _ delivery: Delivery, sentAt: ContinuousClock.Instant) -> Step {
        let intent = delivery.intent
        let item = delivery.item
        let result: APNsResult
        switch answer {
        case .success(let value):
            result = value
            RelayMetrics.apnsLatency.recordNanoseconds((ContinuousClock.now - sentAt).totalNanoseconds)
            delivery.attempts += result.attempts
        case .failure(APNsError.invalidNotification(let invalid)):
            return delivery.finish(makeOutcome(item, intent: intent, status: .rejected, reason: invalid.code.rawValue, attempts: delivery.attempts))
        case .failure(let error):
            // Queue full or shutting down: nothing was sent; wait and try again.
            delivery.lastReason = "\(error)"
            return retryOrGiveUp(delivery)
        }
        let teamID = delivery.credentialIndex.map { configuration.apns.credentials[$0].teamID } ?? ""
        switch result.classification {
        case .delivered:
            clearCredentialFault(teamID: teamID)
            return delivery.finish(makeOutcome(item, intent: intent, status: .delivered, result: result, attempts: delivery.attempts))
        case .rejected:
            return delivery.finish(makeOutcome(item, intent: intent, status: .rejected, result: result, attempts: delivery.attempts))
        case .unregistered:
            return delivery.finish(makeOutcome(item, intent: intent, status: .unregistered, result: result, attempts: delivery.attempts))
        case .credentialFault:
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            recordCredentialFault(teamID: teamID, reason: reason ?? "CredentialFault", now: clock())
            return delivery.finish(makeOutcome(item, intent: intent, status: .failed, result: result, attempts: delivery.attempts))
        case .retryable:
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            delivery.lastReason = reason
            delivery.lastResult = result
            if intent.expiration == 0 {
                // Now or never: one try.
                return delivery.finish(makeOutcome(item, intent: intent, status: .expired, result: result, attempts: delivery.attempts))
            }
            if result.reason == .tooManyRequests, policy != nil {
                // Too fast for this device: it backs off in Redis and the intent waits in its mailbox.
                return .park(due: nowMilliseconds(), tooManyRequests: true)
            }
            logger.debug("retrying", metadata: metadata(item, ["apns.reason": "\(reason ?? "none")"]))
            RelayMetrics.retries.increment()
            return retryOrGiveUp(delivery)
        }
    }

    /// The next backoff, or the final outcome when waiting it would pass the intent's
    /// expiration or the retry deadline.
    func retryOrGiveUp(_ delivery: Delivery) -> Step {
        let delay = backoff.delay(attempt: delivery.retry)
        delivery.retry += 1
        let resumeAt = clock() + delay.components.seconds
        if resumeAt > delivery.intent.expiration {
            return delivery.finish(timeoutOutcome(delivery))
        }
        if resumeAt > delivery.retryDeadline {
            // APNs unavailable past the retry budget: with Redis the intent waits in its mailbox
            // (tried again after the longest backoff) instead of failing.
            guard policy != nil else { return delivery.finish(timeoutOutcome(delivery)) }
            return .park(due: nowMilliseconds() + Int64(configuration.retry.maxBackoffMilliseconds), tooManyRequests: false)
        }
        return .wait(delay)
    }

    func timeoutOutcome(_ delivery: Delivery) -> Outcome {
        let intent = delivery.intent
        let reason = delivery.lastReason
        let expired = intent.expiration <= delivery.retryDeadline
        var outcome = makeOutcome(delivery.item, intent: intent, status: expired ? .expired : .failed,
                                  reason: expired ? (reason ?? "Expired") : "RetryDeadline: \(reason ?? "no answer")",
                                  attempts: delivery.attempts)
        if let last = delivery.lastResult {
            outcome.httpStatus = last.status
            outcome.apnsID = last.apnsID
        }
        return outcome
    }
}
