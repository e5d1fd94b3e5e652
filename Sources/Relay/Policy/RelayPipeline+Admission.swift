import Common
import APNs
import Redis

extension RelayPipeline {
    /// A batch's admission: what was decided without Redis, and what to ask Redis.
    struct Admitting: Sendable {
        var admissions: [Admission]
        /// For each group of the round trip, the batch positions of its intents.
        var members: [[Int]]
        var pending: DevicePolicy.PendingAdmission?
        /// When its round trip began (epoch ns), while spans are exported.
        var startedAt: UInt64 = 0
    }

    /// Starts deciding what the policy says for each message of a batch (invalid ones: `.send`,
    /// they never get that far): groups the intents by device and topic for the question to
    /// Redis, marking those with the same collapse id where the topic coalesces (asked by
    /// ``finishAdmission(_:_:)``, one batch after another).
    func startAdmission(_ parsed: [Result<Intent, InvalidIntent>]) -> Admitting {
        var admitting = Admitting(admissions: Array(repeating: .send, count: parsed.count), members: [])
        guard let policy else { return admitting }
        var groups: [DevicePolicy.Group] = []
        BatchAdmission.group(parsed, rules: configuration.policy.rules(for:), readsUnregistered: configuration.policy.skipKnownUnregistered,
                             groups: &groups, members: &admitting.members)
        if !groups.isEmpty {
            if tracer != nil { admitting.startedAt = wallNanoseconds() }
            admitting.pending = policy.admission(groups)
        }
        return admitting
    }

    /// Waits for a batch's admission. While Redis fails this asks again with backoff (admitting
    /// stops, the consumer's buffer fills and its partitions pause), or with `redis.fail_open`
    /// lets everything through. Nil when cancelled meanwhile.
    func finishAdmission(_ parsed: [Result<Intent, InvalidIntent>], _ admitting: Admitting) async -> [Admission]? {
        var admissions = admitting.admissions
        guard let pending = admitting.pending else { return admissions }
        let answers = await Retry(backoff: backoff, interrupt: stopping).run { () async throws(RedisError) in
            let asked = ContinuousClock.now
            let answers = try await pending.get(now: nowMilliseconds())
            RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - asked).totalNanoseconds)
            redisRecovered()
            return answers
        } failed: { error, _ in
            redisFailed(error)
            return configuration.redis.failOpen ? .giveUp : .retry
        }
        // Given up: with `fail_open` everything goes through; else the relay stops or is cancelled.
        guard let answers else { return configuration.redis.failOpen ? admissions : nil }
        for (index, answer) in answers.enumerated() {
            BatchAdmission.apply(answer, to: admitting.members[index], parsed, &admissions)
        }
        return admissions
    }

    /// Now in epoch milliseconds, for the policy's clocks: the system's milliseconds, or the
    /// injected seconds clock when it disagrees with the system (tests moving time).
    func nowMilliseconds() -> Int64 {
        let milliseconds = APNsIdentifiers.epochMilliseconds()
        let seconds = clock()
        return abs(milliseconds / 1000 - seconds) <= 1 ? milliseconds : seconds * 1000
    }
}
