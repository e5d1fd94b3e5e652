import Common
import APNs
import Redis

extension RelayPipeline {
    /// One intent from consume to outcome. Async functions on this path keep their frames small
    /// (the decisions live in synchronous helpers that are not inlined into them): each frame is
    /// held by every intent in flight.
    ///
    /// Returns when its intent is due from its mailbox when it was parked (nil when it was not).
    @inline(never)
    @discardableResult
    func handle(_ item: WorkItem) async -> Int64? {
        if case .readmit = item.admission {
            // Decided now, in its device's turn: its batch's read of its keys failed, or could
            // not see a copy's answer recorded, or a park of its device, after it (that decision
            // was counted already).
            guard let (decided, forgets) = await readmit(item), case .success(let intent) = item.intent else {
                await conclude(item, Ending())
                return nil
            }
            let (admission, decision) = shadowed(decided, intent, counted: item.policyDecision != nil)
            var records = false
            if deduplicator != nil, case .send = admission { records = true }
            return await handle(item.admitted(as: admission, recordsAnswer: records, policyDecision: decision,
                                              forgetsUnregistered: forgets))
        }
        let ending: Ending
        var parkedDue: Int64?
        if case .park(let due) = item.admission, await park(item, due: due) {
            ending = Ending(parked: true)
            parkedDue = due
        } else if let delivery = prepare(item) {
            await send(delivery)
            ending = delivery.ending
            parkedDue = ending.parked ? delivery.parkedDue : nil
        } else {
            ending = await earlyEnding(item)
        }
        await conclude(item, ending)
        return parkedDue
    }

    /// Badge change (if any), then delivery.
    @inline(never)
    func send(_ delivery: Delivery) async {
        if delivery.intent.pushType == .liveactivity, delivery.intent.channelID == nil, await !pace(delivery) { return }
        if delivery.intent.badge != nil, await !applyBadge(delivery) { return }
        await deliver(delivery)
        settle(delivery)
        if delivery.pacedBudget != nil, delivery.ending.outcome?.status == .delivered { await rescoreBudget(delivery) }
    }

    /// Moves the Live Activity budget spend of a push APNs accepted to now
    /// (``LiveActivityPacer/accepted(_:token:topic:intentID:windowSeconds:now:)``). Once, not
    /// retried: a spend it could not move stays scored from before the send, as before.
    @inline(never)
    func rescoreBudget(_ delivery: Delivery) async {
        guard let pacer = liveActivityPacer, let (budget, window) = delivery.pacedBudget else { return }
        let intent = delivery.intent
        do {
            try await pacer.accepted(budget, token: intent.token, topic: intent.topic, intentID: intent.id, windowSeconds: window,
                                     now: nowMilliseconds())
        } catch {
            logger.debug("Live Activity budget spend not moved to its acceptance", metadata: metadata(delivery.item, ["error": "\(error)"]))
        }
    }

    /// Adds the badge sent to the outcome and, where dedupe records keep it (with Redis), notes
    /// the device's last notification. The outcome is changed where it is, not copied.
    @inline(never)
    func settle(_ delivery: Delivery) {
        let ending = delivery.ending
        guard ending.outcome != nil else { return }
        ending.outcome!.badge = delivery.badge
        if delivery.priorityDowngraded { ending.outcome!.priorityDowngraded = true }
        if let decision = delivery.policyDecision { ending.outcome!.policyDecision = decision }
        if deduplicator != nil, ending.outcome!.status == .delivered, delivery.intent.channelID == nil {
            ending.lastSent = DeviceRecords.lastSent(delivery.intent, delivery.notification,
                                                     apnsID: ending.outcome!.apnsID, at: ending.outcome!.at)
        }
    }

    /// The delivery of a usable intent that is to be sent; nil for the others (see
    /// ``earlyEnding(_:)``).
    @inline(never)
    func prepare(_ item: WorkItem) -> Delivery? {
        guard case .success(let intent) = item.intent else { return nil }
        switch item.admission {
        case .send, .park:
            // A channel has no 429 backoff: its retries end at the retry deadline (it parks
            // only where its own rate limit holds it, at admission).
            // In shadow mode a 429 is retried as with the policy off, not parked.
            let limits = DeliveryStateMachine.Limits(retryDeadline: 0, canPark: policy != nil && intent.channelID == nil
                                                         && configuration.policy.rules(for: intent.topic).mode == .enforce,
                                                     parkAfterDeadlineMilliseconds: Int64(configuration.retry.maxBackoffMilliseconds))
            let machine = DeliveryStateMachine(expiration: intent.expiration, limits: limits, backoff: backoff)
            return Delivery(intent: intent, item: item, credentialIndex: credentials.index(forTopic: intent.topic), machine: machine,
                            precedence: lanePrecedence[item.lane])
        default: return nil
        }
    }

    /// One intent's delivery across its attempts: what is sent, and the state machine that
    /// decides (``DeliveryStateMachine``). `@unchecked Sendable`: one step of its intent touches
    /// it at a time (a task's frames, or callbacks each started by the one before). It is its
    /// own ``Ending`` (``ending``): a separate object would be one more allocation per intent.
    final class Delivery: Ending, @unchecked Sendable {
        let intent: Intent
        let item: WorkItem
        var notification: APNsNotification
        /// The badge count written into the payload, for intents that change it.
        var badge: Int64?
        /// Which credentials send for the intent's topic (nil: none do).
        let credentialIndex: Int?
        /// How it ended: itself.
        var ending: Ending { self }
        var machine: DeliveryStateMachine
        /// The client the next attempt goes through.
        var client: APNsClient?
        /// When it is due from its mailbox, once parked.
        var parkedDue: Int64?
        /// A priority-10 Live Activity update past its budget, sent at priority 5.
        var priorityDowngraded = false
        /// The outcome's `policy_decision` when a decision came past the admission in shadow
        /// mode (a start past its budget, a 429: `park`), else the admission's.
        var policyDecision: String?
        /// The Live Activity budget its push spent (and the budget's window, seconds): re-scored
        /// when APNs accepts it.
        var pacedBudget: (budget: LiveActivityPacer.Budget, windowSeconds: Int64)?

        init(intent: Intent, item: WorkItem, credentialIndex: Int?, machine: DeliveryStateMachine, precedence: Int) {
            self.intent = intent
            self.item = item
            self.notification = intent.notification
            self.notification.precedence = precedence
            self.credentialIndex = credentialIndex
            self.machine = machine
            super.init()
        }
    }

    /// Paces a Live Activity push by the device's budgets (``LiveActivityPacer``, with Redis): a
    /// priority-10 update past its activity's hourly budget goes out at priority 5 (an `end`
    /// counts and is never downgraded); a push-to-start past its token's window waits in the
    /// device's mailbox until the window allows, as any parked intent (a newer one displaces it,
    /// its expiration ends it). False when the delivery ended here (parked, or abandoned).
    /// Redis failing with `redis.fail_open`: sent unpaced. In shadow mode (`policy.mode`) the
    /// budget is spent as in enforce mode, and the push goes out as it came, its outcome saying
    /// `park` for a start past its budget (which spends nothing here: enforce mode spends for it
    /// when it leaves the mailbox). In both modes a push past its budget is counted in
    /// `apns_relay_policy_decisions_total` (decision `park` for a start, `downgrade` for an
    /// update).
    @inline(never)
    func pace(_ delivery: Delivery) async -> Bool {
        guard let pacer = liveActivityPacer else { return true }
        let intent = delivery.intent
        let rules = configuration.policy.rules(for: intent.topic), budgets = rules.liveActivity
        guard let event = delivery.notification.payload.withUnsafeReadableBytes({ PushTypePayloads.liveActivityEvent($0) }) else {
            return true
        }
        let start = event == "start"
        let (budget, limit, window): (LiveActivityPacer.Budget, Int, Int64) = start
            ? (.start, budgets.startsPerWindow, budgets.startWindowSeconds)
            : (.priority10, budgets.priority10PerHour, 3600)
        guard limit > 0, start || delivery.notification.effectivePriority == 10 else { return true }
        // Now as each try asks: a spend scored before a long Redis outage would leave the
        // window early.
        guard let spent = await withRedisRetries(delivery.item, { () throws(RedisError) -> Int64? in
            try await pacer.spend(budget, token: intent.token, topic: intent.topic, intentID: intent.id, limit: limit,
                                  windowSeconds: window, now: nowMilliseconds())
        }) else {
            return isCurrent(delivery.item) && !Task.isCancelled
        }
        let topic = metricsTopic(intent.topic)
        guard let wait = spent else {
            RelayMetrics.liveActivityBudgetSpent(topic: topic, budget: budget.name)
            delivery.pacedBudget = (budget, window)
            return true
        }
        let now = nowMilliseconds()
        // Counted in both modes, so that shadow and enforce compare (the admission counted `send`).
        if start || event != "end" {
            RelayMetrics.policyDecision(topic: topic, decision: start ? "park" : "downgrade", mode: rules.mode.rawValue)
        }
        if rules.mode == .shadow {
            // What enforce mode would have done with a start (an update stays `send`, downgraded).
            if start { delivery.policyDecision = "park" }
            return true
        }
        if start {
            RelayMetrics.liveActivityStartsDeferred(topic: topic)
            if await park(delivery.item, due: now + wait) {
                delivery.ending.parked = true
                delivery.parkedDue = now + wait
                return false
            }
            // Not parked (Redis failing with redis.fail_open): sent as it is.
            return isCurrent(delivery.item) && !Task.isCancelled
        }
        if event != "end" {
            delivery.notification.priority = 5
            delivery.priorityDowngraded = true
            RelayMetrics.liveActivityDowngrades(topic: topic)
        }
        return true
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
    /// was abandoned, its partition revoked). The retry budget (`retry.deadline_seconds`) runs
    /// from the intent's consumption, so one that waited behind its device's earlier intents has
    /// only what is left of it; an intent taken from its mailbox has it whole from the take (it
    /// was parked to wait: its expiration bounds that).
    ///
    /// Its async frame is held by every intent in flight, so it keeps only the machine's small
    /// action: each step's values live in the frames of the helpers it awaits.
    @inline(never)
    func deliver(_ delivery: Delivery) async {
        startRetryBudget(delivery)
        await drive(delivery, from: attemptDue(delivery))
    }

    /// Sets the delivery's retry deadline (``deliver(_:)``).
    func startRetryBudget(_ delivery: Delivery) {
        let waited = delivery.item.mailboxMember == nil ? ContinuousClock.now - delivery.item.consumedAt : .zero
        delivery.machine.limits.retryDeadline = clock() - waited.components.seconds + configuration.retry.deadlineSeconds
    }

    /// Runs the machine from `action` until the delivery ended.
    @inline(never)
    func drive(_ delivery: Delivery, from first: DeliveryStateMachine.Action) async {
        var action = first
        while true {
            switch action {
            case .finish:
                return ended(delivery)
            case .send:
                action = await attempt(delivery)
            case .wait(let delay):
                // Waiting to try again, it has nothing at APNs: a revocation need not wait for it.
                leftAPNs(delivery)
                action = await backOff(delivery, delay)
            case .park(let due, let tooManyRequests):
                action = await park(delivery, due: due, tooManyRequests: tooManyRequests)
            }
        }
    }

    /// One send through the client `attemptDue` picked, and what its answer means.
    @inline(never)
    func attempt(_ delivery: Delivery) async -> DeliveryStateMachine.Action {
        guard let client = delivery.client else { return delivery.machine.cancelled() }
        let sentAt = ContinuousClock.now
        delivery.item.traced?.sendBegins()
        let answer: Result<APNsResult, any Error>
        do {
            answer = .success(try await client.send(delivery.notification))
        } catch {
            answer = .failure(error)
        }
        delivery.item.traced?.sendEnds()
        let action = judge(answer, delivery, sentAt: sentAt)
        if case .success(let result) = answer, result.reason == .tooManyRequests { await noteShadowBackoff(delivery) }
        return action
    }

    /// Waits out a backoff; cancelled (the shutdown deadline passed), the delivery is abandoned.
    @inline(never)
    func backOff(_ delivery: Delivery, _ delay: Duration) async -> DeliveryStateMachine.Action {
        tasksInBackoff.add(1, ordering: .relaxed)
        defer { tasksInBackoff.subtract(1, ordering: .relaxed) }
        do {
            try await Task.sleep(for: delay)
            return attemptDue(delivery)
        } catch {
            return delivery.machine.cancelled()
        }
    }

    /// Parks the intent in its mailbox (a 429, or a retry past the budget).
    @inline(never)
    func park(_ delivery: Delivery, due: Int64, tooManyRequests: Bool) async -> DeliveryStateMachine.Action {
        let parked = await park(delivery.item, due: due, tooManyRequests: tooManyRequests)
        if parked { delivery.parkedDue = due }
        if parked, tooManyRequests {
            // Counted as shadow mode counts its 429s (``noteShadowBackoff(_:)``).
            RelayMetrics.policyDecision(topic: metricsTopic(delivery.intent.topic), decision: "park",
                                        mode: RelayConfiguration.Policy.Mode.enforce.rawValue)
        }
        return delivery.machine.park(succeeded: parked, tooManyRequests: tooManyRequests, now: clock(),
                                     nowMilliseconds: nowMilliseconds())
    }

    @inline(never)
    func ended(_ delivery: Delivery) {
        end(delivery, delivery.machine.ending ?? .abandoned)
    }

    /// An attempt is due: the machine's say, then what the credential allows (a certificate's
    /// validity and environment, MDM on certificates only), the team's credential-fault
    /// cool-down and the client for the intent's endpoint (kept in the delivery for the send).
    @inline(never)
    func attemptDue(_ delivery: Delivery) -> DeliveryStateMachine.Action {
        let now = clock()
        // Past the shutdown deadline nothing new goes to APNs (an intent driven by callbacks
        // has no task for the deadline to cancel).
        let action = delivery.machine.attemptDue(now: now, isOwned: !Task.isCancelled && !abandoning.isOpen && mayGoToAPNs(delivery),
                                                 hasCredentials: delivery.credentialIndex != nil)
        guard case .send = action, let credentialIndex = delivery.credentialIndex else { return action }
        if let refusal = Self.certificateRefusal(certificates[credentialIndex], delivery.intent, now: now) {
            return delivery.machine.notSent(refusal)
        }
        if let fault = activeCredentialFault(teamID: credentialTeams[credentialIndex], now: now) {
            return delivery.machine.notSent(fault)
        }
        do {
            delivery.client = try client(credentialIndex: credentialIndex, environment: delivery.intent.environment)
        } catch {
            return delivery.machine.notSent("ClientSetup: \(error)")
        }
        return action
    }

    /// Why `intent` may not go out with its credential (`certificate`: what the credential's
    /// certificate says, nil for a token), or nil: an MDM push needs a certificate (an intent
    /// parked before its topic's credential became a token is caught here), and a certificate
    /// must be valid at `now` (epoch s) and made for the intent's environment (else APNs
    /// answers 403 BadCertificateEnvironment, a credential fault of every intent of it).
    static func certificateRefusal(_ certificate: APNsCertificateInfo?, _ intent: Intent, now: Int64) -> String? {
        guard let certificate else {
            return intent.pushType == .mdm ? "MDMNeedsCertificate: \(intent.topic)'s credential is a token" : nil
        }
        if Double(now) >= certificate.notValidAfter.timeIntervalSince1970 {
            return "CertificateExpired: the certificate of \(certificate.subject) expired"
        }
        if Double(now) < certificate.notValidBefore.timeIntervalSince1970 {
            return "CertificateNotYetValid: the certificate of \(certificate.subject) is not valid yet"
        }
        if !certificate.allows(production: intent.environment == .production) {
            return "BadCertificateEnvironment: the certificate of \(certificate.subject) is not for \(intent.environment.rawValue)"
        }
        return nil
    }

    /// Feeds APNs' answer (or the send's error) to the machine, with its effects: latency, the
    /// team's credential faults, retries counted and logged.
    @inline(never)
    func judge(_ answer: Result<APNsResult, any Error>, _ delivery: Delivery, sentAt: ContinuousClock.Instant,
               answeredAt: ContinuousClock.Instant = .now) -> DeliveryStateMachine.Action {
        let result: APNsResult
        switch answer {
        case .success(let value):
            result = value
            RelayMetrics.apnsLatency.recordNanoseconds((answeredAt - sentAt).totalNanoseconds)
        case .failure(APNsError.invalidNotification(let invalid)):
            return delivery.machine.invalid(code: invalid.code.rawValue)
        case .failure(is CancellationError):
            // The shutdown deadline passed (or the relay was cancelled): abandoned.
            return delivery.machine.cancelled()
        case .failure(let error):
            // Queue full or shutting down: nothing was sent; wait and try again.
            return delivery.machine.sendFailed("\(error)", now: clock(), nowMilliseconds: nowMilliseconds())
        }
        let teamID = delivery.credentialIndex.map { credentialTeams[$0] } ?? ""
        switch result.classification {
        case .delivered:
            clearCredentialFault(teamID: teamID)
        case .credentialFault:
            let reason = result.reason?.description ?? result.failure.map { "\($0)" }
            recordCredentialFault(teamID: teamID, reason: reason ?? "CredentialFault", now: clock())
        case .rejected, .unregistered, .retryable:
            break
        }
        let retries = delivery.machine.retries
        let action = delivery.machine.answered(result, now: clock(), nowMilliseconds: nowMilliseconds())
        if delivery.machine.retries > retries {
            logger.debug("retrying", metadata: metadata(delivery.item, ["apns.reason": "\(delivery.machine.lastReason ?? "none")"]))
            RelayMetrics.retries.increment()
        }
        return action
    }

    /// Puts how the delivery ended into its ending: the outcome, or parked, or nothing
    /// (abandoned).
    @inline(never)
    func end(_ delivery: Delivery, _ ending: DeliveryStateMachine.Ending) {
        let item = delivery.item, intent = delivery.intent, attempts = delivery.machine.attempts
        switch ending {
        case .abandoned:
            delivery.ending.outcome = nil
        case .parked:
            delivery.ending.parked = true
        case .answered(let status, let result):
            delivery.ending.outcome = makeOutcome(item, intent: intent, status: status, result: result, attempts: attempts)
        case .ended(let status, let reason):
            delivery.ending.outcome = makeOutcome(item, intent: intent, status: status, reason: reason, attempts: attempts)
        case .timedOut(let status, let reason, let last):
            var outcome = makeOutcome(item, intent: intent, status: status, reason: reason, attempts: attempts)
            if let last {
                outcome.httpStatus = last.status
                outcome.apnsID = last.apnsID
            }
            delivery.ending.outcome = outcome
        }
    }
}
