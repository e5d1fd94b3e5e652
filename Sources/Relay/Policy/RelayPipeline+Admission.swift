import Common
import APNs
import Redis

extension RelayPipeline {
    /// A batch's admission: what was decided without Redis, and what to ask Redis.
    struct Admitting: Sendable {
        var admissions: [Admission]
        /// Per batch position, whether its delivery deletes the pair's remembered 410
        /// (``DeviceAdmission/Decided/forgetsUnregistered``, ``WorkItem/forgetsUnregistered``).
        var forgetsUnregistered: [Bool]
        /// For each group of the round trip, the batch positions of its intents.
        var members: [[Int]]
        var pending: DevicePolicy.PendingAdmission?
        /// When its round trip began (epoch ns), while spans are exported.
        var startedAt: UInt64 = 0
        /// Its read of Redis (dedupe records, mailboxes), while the batch is held (nil without one):
        /// what was answered or parked after it began, it could not see.
        var read: AdmissionRead?
    }

    /// Starts deciding what the policy says for each message of a batch (invalid ones: `.send`,
    /// they never get that far): groups the intents by device and topic for the question to
    /// Redis, marking those with the same collapse id where the topic coalesces (asked by
    /// ``finishAdmission(_:_:)``, one batch after another).
    func startAdmission(_ parsed: [Result<Intent, InvalidIntent>]) async -> Admitting {
        var admitting = Admitting(admissions: Array(repeating: .send, count: parsed.count),
                                  forgetsUnregistered: Array(repeating: true, count: parsed.count), members: [])
        guard let policy else { return admitting }
        var groups: [DeviceAdmission.Group] = []
        BatchAdmission.group(parsed, rules: configuration.policy.rules(for:recipient:),
                             skipsKnownUnregistered: configuration.policy.skipKnownUnregistered,
                             groups: &groups, members: &admitting.members)
        if !groups.isEmpty {
            if tracer != nil { admitting.startedAt = wallNanoseconds() }
            // Marked before the read is written: an answer recorded, or a park, after the mark
            // may be missing from what it reads.
            // One mark per shard: each shard counts its own answers and parks, on its loop.
            var marks: [UInt64] = []
            marks.reserveCapacity(shards.count)
            for shard in shards { marks.append(await shard.onLoop { $0.queues.recentAnswers.readBegan() }) }
            admitting.read = AdmissionRead(marks: marks) { [weak self] marks in
                guard let self else { return }
                // Its end waits for nothing: each shard's mark ends in a turn of its loop.
                for (box, mark) in zip(self.shards, marks) {
                    box.loop.execute { box.withState { $0.queues.recentAnswers.readEnded(mark) } }
                }
            }
            admitting.pending = policy.admission(groups)
        }
        return admitting
    }

    /// Waits for a batch's admission. While Redis fails this asks again with backoff (admitting
    /// stops, the consumer's buffer fills and its partitions pause), or with `redis.fail_open`
    /// lets everything through. Nil when cancelled meanwhile. With the admissions, per position
    /// whether a delivery deletes the pair's remembered 410 (``Admitting/forgetsUnregistered``).
    func finishAdmission(_ parsed: [Result<Intent, InvalidIntent>], _ admitting: Admitting) async -> ([Admission], [Bool])? {
        var admissions = admitting.admissions, forgetsUnregistered = admitting.forgetsUnregistered
        guard let pending = admitting.pending else { return (admissions, forgetsUnregistered) }
        let answers = await Retry(backoff: backoff, interrupt: stopping).run { () async throws(RedisError) in
            let asked = ContinuousClock.now
            let answers = try await pending.get(now: nowMilliseconds())
            RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - asked).totalNanoseconds)
            // Every device's read failed: Redis itself is in trouble (LOADING, CLUSTERDOWN...),
            // an outage as when the round trip fails.
            if !answers.isEmpty, !answers.contains(where: { if case .success = $0 { true } else { false } }),
               case .failure(let error) = answers[0] {
                throw error
            }
            health.redisRecovered()
            return answers
        } failed: { error, _ in
            health.redisFailed(error)
            return configuration.redis.failOpen ? .giveUp : .retry
        }
        // Given up: with `fail_open` everything goes through; else the relay stops or is cancelled.
        guard let answers else { return configuration.redis.failOpen ? (admissions, forgetsUnregistered) : nil }
        var failed: (count: Int, error: RedisError)?
        for (index, answer) in answers.enumerated() {
            switch answer {
            case .success(let decided):
                BatchAdmission.apply(decided, to: admitting.members[index], parsed, &admissions, forgetsUnregistered: &forgetsUnregistered)
            case .failure(let error):
                // This device's keys only: its intents are decided again in their turn.
                for position in admitting.members[index] where Self.isUsable(parsed[position]) { admissions[position] = .readmit }
                failed = ((failed?.count ?? 0) + 1, failed?.error ?? error)
            }
        }
        if let failed {
            logger.warning("Redis answered some devices' admission with an error: they are decided again in their turn",
                           metadata: ["redis.error": "\(failed.error)", "relay.devices": "\(failed.count)"])
        }
        return (admissions, forgetsUnregistered)
    }

    /// What the policy decided, as outcomes and metrics name it: `send`, `duplicate`, `park`,
    /// `coalesce` or `skip` (answered without sending: a remembered 410, a now-or-never intent
    /// the device could not take); nil for what is no policy decision (an intent already in its
    /// mailbox, one decided again later, one the relay itself answers).
    static func policyDecision(_ admission: Admission) -> String? {
        switch admission {
        case .send: "send"
        case .duplicate: "duplicate"
        case .park: "park"
        case .coalesced: "coalesce"
        case .knownUnregistered, .nowOrNever: "skip"
        case .inMailbox, .readmit, .expiredParked, .recipientBacklog: nil
        }
    }

    /// With Redis, names each usable intent's decision and counts it
    /// (`apns_relay_policy_decisions_total{apns_topic,decision,mode}`); where its topic's
    /// `policy.mode` is `shadow`, the intent then goes out as with the policy off (its admission
    /// becomes `send`). An intent its mailbox holds already stays there whatever the mode: it
    /// was parked in enforce mode, and its mailbox answers it. Returns the decisions by position.
    func applyPolicyMode(_ admissions: inout [Admission], _ parsed: [Result<Intent, InvalidIntent>]) -> [String?] {
        guard policy != nil else { return Array(repeating: nil, count: admissions.count) }
        var decisions: [String?] = Array(repeating: nil, count: admissions.count)
        for position in admissions.indices {
            guard case .success(let intent) = parsed[position] else { continue }
            (admissions[position], decisions[position]) = shadowed(admissions[position], intent)
        }
        return decisions
    }

    /// One intent's admission under its topic's mode, and its decision (counted, unless
    /// `counted`: an intent decided again in its turn counts once).
    func shadowed(_ admission: Admission, _ intent: Intent, counted: Bool = false) -> (Admission, String?) {
        guard let decision = Self.policyDecision(admission) else { return (admission, nil) }
        let mode = configuration.policy.rules(for: intent.topic).mode
        if !counted { RelayMetrics.policyDecision(topic: metricsTopic(intent.topic), decision: decision, mode: mode.rawValue) }
        return (mode == .shadow ? .send : admission, decision)
    }

    /// A 429 for a device whose topic is in shadow mode: enforce mode would have parked the
    /// intent and backed the device off. The decision is counted and named on the outcome
    /// (`park`), and the device's backoff moves as enforce mode's park moves it, so that later
    /// admissions decide as enforce mode's would; the intent is retried as with the policy off.
    /// One try: a Redis that fails leaves the backoff where it was (shadow mode only observes).
    /// Once per delivery, as enforce mode parks once (its retries would raise the backoff's
    /// level again), and not for a now-or-never intent, which enforce mode does not park.
    func noteShadowBackoff(_ delivery: Delivery) async {
        let intent = delivery.intent
        guard let policy, intent.channelID == nil, intent.expiration != 0, delivery.policyDecision != "park",
              configuration.policy.rules(for: intent.topic).mode == .shadow else { return }
        RelayMetrics.policyDecision(topic: metricsTopic(intent.topic), decision: "park", mode: RelayConfiguration.Policy.Mode.shadow.rawValue)
        delivery.policyDecision = "park"
        do {
            _ = try await policy.noteBackoff(token: intent.token, now: nowMilliseconds())
        } catch {
            logger.warning("a 429 in shadow mode did not move the device's backoff", metadata: metadata(delivery.item, ["redis.error": "\(error)"]))
        }
    }

    /// The `apns_topic` label for `topic`: a configured one, else `other` (labels stay bounded).
    func metricsTopic(_ topic: String) -> String {
        credentials.index(forTopic: topic) != nil ? topic : "other"
    }

    static func isUsable(_ parsed: Result<Intent, InvalidIntent>) -> Bool {
        if case .success = parsed { return true }
        return false
    }

    /// Decides an intent whose device's read failed while its batch was admitted, or could not
    /// see a copy's answer or a park of its device (``Admission/readmit``), alone, asking Redis until it answers (with backoff; an error reply counts as Redis
    /// failing), as long as the item's partition is ours; with `redis.fail_open` it is sent.
    /// Nil when given up (revoked, or the relay stopping past its deadline). With the admission,
    /// whether this read says a delivery deletes the pair's remembered 410
    /// (``DeviceAdmission/Decided/forgetsUnregistered``; true where there was no read).
    func readmit(_ item: WorkItem) async -> (Admission, forgetsUnregistered: Bool)? {
        guard let policy, case .success = item.intent else { return (.send, true) }
        var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
        BatchAdmission.group([item.intent], rules: configuration.policy.rules(for:recipient:),
                             skipsKnownUnregistered: configuration.policy.skipKnownUnregistered, groups: &groups, members: &members)
        guard !groups.isEmpty else { return (.send, true) }
        let pending = policy.admission(groups)
        let answer = await withRedisRetries(item) { () throws(RedisError) -> DeviceAdmission.Decided in
            try await pending.get(now: nowMilliseconds())[0].get()
        }
        // Given up while still ours: Redis refused the read, or `redis.fail_open`: sent without
        // the policy, as any intent then.
        guard let answer else { return isCurrent(item) && !Task.isCancelled ? (.send, true) : nil }
        var admissions: [Admission] = [.send], forgetsUnregistered = [true]
        BatchAdmission.apply(answer, to: members[0], [item.intent], &admissions, forgetsUnregistered: &forgetsUnregistered)
        return (admissions[0], forgetsUnregistered[0])
    }

    /// Now in epoch milliseconds, for the policy's clocks: the system's milliseconds, or the
    /// injected seconds clock when it disagrees with the system (tests moving time).
    func nowMilliseconds() -> Int64 {
        let milliseconds = APNsIdentifiers.epochMilliseconds()
        let seconds = clock()
        return abs(milliseconds / 1000 - seconds) <= 1 ? milliseconds : seconds * 1000
    }
}
