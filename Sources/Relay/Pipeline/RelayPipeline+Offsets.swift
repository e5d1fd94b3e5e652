import Dispatch
import Kafka

extension RelayPipeline {
    /// An item that ended (``finish(_:thenNext:)``). `stored`: its offset may be stored (its
    /// outcome was delivered, or it parked). `sent`: it was counted among its partition's work
    /// at APNs; a revocation waiting for that work goes on once the last of it ended.
    struct Finished {
        let item: WorkItem
        let stored: Bool
        let sent: Bool
    }

    /// Ends an item: its offset becomes committable once it and every earlier one are done.
    func finish(_ item: WorkItem, stored: Bool, sent: Bool) {
        finish([Finished(item: item, stored: stored, sent: sent)], thenNext: false)
    }

    /// Ends items, as many as one poll's delivery reports concluded, in one turn of the state
    /// lock and one offset store (``KafkaConsumer/storeOffsets(_:)``) for all their partitions;
    /// with `thenNext`, ends their turns in their devices' queues too and returns the items
    /// queued behind them, to start now (as ``nextInQueue(after:parkedUntil:)`` does, with
    /// nothing parked).
    ///
    /// The offsets are stored inside the state lock: two calls finishing at once must store their
    /// positions in order (a later store of an older position would move the commit back), and
    /// the drain that waits for the last item must find its offset stored.
    @discardableResult
    func finish(_ items: [Finished], thenNext: Bool) -> [WorkItem] {
        for finished in items {
            // Its spans end here if no outcome ended them (parked: stored without one).
            finished.item.traced?.end(without: finished.stored ? "parked" : "unfinished")
        }
        var released: [TopicPartition] = []
        var revokeWaiter: DispatchSemaphore?
        let (notStored, next, waiters, idleWaiters, inFlight) = state.withLock { state in
            // The newest committable offset of each partition the items moved (a later finish
            // of a partition only moves it further).
            var committable: [(partition: TopicPartition, offset: Int64)] = []
            for finished in items {
                let item = finished.item
                Self.freeSlot(of: item, &state)
                if let member = item.mailboxMember { state.mailboxJobs.remove(member) }
                // Intents from a mailbox had their offsets stored when they were parked.
                if finished.stored, item.mailboxMember == nil,
                   let offset = state.partitions.finish(item.partition, generation: item.generation, offset: item.offset) {
                    if let index = committable.firstIndex(where: { $0.partition == item.partition }) {
                        committable[index].offset = offset
                    } else {
                        committable.append((item.partition, offset))
                    }
                }
                if finished.sent, let waiter = Self.endAtAPNs(item, &state) { revokeWaiter = waiter }
            }
            let failed = consumer.storeOffsets(committable)
            let notStored = failed.compactMap { failure in committable.first { $0.partition == failure.0 } }
            for (partition, _) in committable where state.partitions.releaseIfDrained(partition) { released.append(partition) }
            var next: [WorkItem] = []
            if thenNext {
                for finished in items {
                    if let turn = DeviceQueues.turn(of: finished.item),
                       let queued = Self.nextQueued(after: finished.item, turn, parkedUntil: [:], &state) { next.append(queued) }
                }
            }
            let waiters = state.lanes.waitersWithRoom()
            var idleWaiters: [CheckedContinuation<Bool, Never>] = []
            if state.inFlight == 0, !state.idleWaiters.isEmpty {
                idleWaiters = Array(state.idleWaiters.values)
                state.idleWaiters.removeAll()
            }
            // Each item's lane's count (not the ledger's array: held past the lock, it would make
            // the next change copy it).
            return (notStored, next, waiters, idleWaiters, items.map { state.lanes.inFlight[$0.item.lane] })
        }
        for (partition, offset) in notStored {
            logger.info("offset not stored (partition no longer ours)", metadata: [
                "kafka.partition": "\(partition.partition)", "kafka.offset": "\(offset)",
            ])
        }
        for (finished, inFlight) in zip(items, inFlight) { laneMetrics[finished.item.lane].inFlight.record(inFlight) }
        for waiter in waiters { waiter.resume() }
        for waiter in idleWaiters { waiter.resume(returning: true) }
        revokeWaiter?.signal()
        for partition in released { self.released(partition) }
        return next
    }

    /// The item no longer counts among its partition's work at APNs; returns the revocation's
    /// waiter to signal when that was the last of it.
    static func endAtAPNs(_ item: WorkItem, _ state: inout State) -> DispatchSemaphore? {
        state.partitions.sentWorkEnded(item.partition, generation: item.generation)
        guard state.revokeWaiter != nil, state.partitions.revokingSettled else { return nil }
        defer { state.revokeWaiter = nil }
        return state.revokeWaiter
    }

    static let revocationWaitLimitSeconds = 60
    /// How long a revocation goes on waiting past its usual bound while Redis fails: well inside
    /// librdkafka's `max.poll.interval.ms` (300 s by default), past which the group would take
    /// the partitions away without a commit.
    static let revocationRedisWaitLimitSeconds = 180

    /// On the consumer's poll thread, before a revocation's commit: no new work of
    /// `partitions` starts from now on, and, unless the assignment was lost, this waits (up to
    /// the shutdown deadline, 60 s at most) until their requests at APNs were answered and
    /// concluded, their offsets stored, so that the commit covers them up to the partition's
    /// first unfinished intent and the next owner does not send them again.
    ///
    /// While Redis fails (without `redis.fail_open`), a relay that is not stopping goes on
    /// waiting, up to ``revocationRedisWaitLimitSeconds`` in all: the answers APNs gave wait for
    /// their records, and a partition moved before they land has its next owner, finding no
    /// record, send them again. The partitions could not go on elsewhere meanwhile anyway: their
    /// next owner needs Redis to admit anything. A stopping relay keeps the usual bound, which
    /// its pod's grace period counts on.
    func partitionsRevoking(_ partitions: [TopicPartition], lost: Bool) {
        let semaphore = DispatchSemaphore(value: 0)
        let settled = state.withLock { state -> Bool in
            state.partitions.markRevoking(partitions)
            if lost || state.partitions.revokingSettled { return true }
            state.revokeWaiter = semaphore
            return false
        }
        logger.info("partitions being revoked: their new work stops", metadata: [
            "kafka.partitions": "\(partitions.map(\.partition))", "kafka.assignment_lost": "\(lost)",
        ])
        guard !settled else { return }
        // Well inside librdkafka's max.poll.interval.ms (300 s by default): the poll thread waits.
        let bound = min(configuration.shutdownDeadlineSeconds, Self.revocationWaitLimitSeconds)
        let started = ContinuousClock.now
        var waited = semaphore.wait(timeout: .now() + .seconds(bound))
        if waited == .timedOut, awaitsRedis {
            logger.warning("revocation waits for Redis: answers from APNs wait for their records", metadata: [
                "kafka.partitions": "\(partitions.map(\.partition))",
            ])
            let limit = started + .seconds(Self.revocationRedisWaitLimit(configuration.kafka.consumerSettings))
            while waited == .timedOut, awaitsRedis, ContinuousClock.now < limit {
                waited = semaphore.wait(timeout: .now() + .seconds(1))
            }
            // Redis answers again: the records retrying land within a backoff step or two.
            let rest = min(limit - ContinuousClock.now, backoff.maximum + .seconds(bound))
            if waited == .timedOut, !stopping.isOpen, rest > .zero {
                waited = semaphore.wait(timeout: .now() + .milliseconds(Int(rest.totalMilliseconds)))
            }
        }
        if waited == .timedOut {
            state.withLock { $0.revokeWaiter = nil }
            logger.warning("revocation goes on with work still at APNs (its next owner may send it again)", metadata: [
                "kafka.partitions": "\(partitions.map(\.partition))",
                "relay.waited_seconds": "\((ContinuousClock.now - started).components.seconds)",
            ])
        }
    }

    /// ``revocationRedisWaitLimitSeconds``, or less with a `max.poll.interval.ms` configured
    /// below 190 s: 10 s inside it (the revocation's commit retries come on top).
    static func revocationRedisWaitLimit(_ consumerSettings: [String: String]) -> Int {
        let pollInterval = consumerSettings["max.poll.interval.ms"].flatMap { Int($0) }.map { $0 / 1000 } ?? 300
        return min(Self.revocationRedisWaitLimitSeconds, max(pollInterval - 10, 0))
    }

    /// Whether a revocation waits for Redis past its usual bound (``partitionsRevoking(_:lost:)``):
    /// the calls work waits on (records, admissions) fail, not only the mailbox poll.
    private var awaitsRedis: Bool {
        !configuration.redis.failOpen && !stopping.isOpen && incidents.value.redisTroubles[.calls] != nil
    }

    /// A partition reached `limits.max_uncommitted_per_partition`: paused until half of its
    /// offsets are committable.
    func held(_ partition: TopicPartition) {
        reconcilePauses([partition])
        RelayMetrics.partitionsHeld.record(state.withLock { $0.partitions.held.count })
        logger.warning("partition paused: too many offsets wait behind an unfinished intent", metadata: [
            "kafka.partition": "\(partition.partition)", "relay.limit": "\(configuration.limits.maxUncommittedPerPartition)",
        ])
    }

    func released(_ partition: TopicPartition) {
        reconcilePauses([partition])
        RelayMetrics.partitionsHeld.record(state.withLock { $0.partitions.held.count })
        logger.info("partition resumed", metadata: ["kafka.partition": "\(partition.partition)"])
    }

    /// Pauses or resumes `partitions` so that exactly those the ledger holds (too many
    /// uncommitted offsets) stay paused. Each hold and release is followed by a call, and calls
    /// take turns (``pauses``, which also remembers what was applied), so the last one applies
    /// the last state whichever order the changes came in.
    func reconcilePauses(_ partitions: [TopicPartition]) {
        guard !partitions.isEmpty else { return }
        pauses.withLock { paused in
            let wanted = state.withLock { state in partitions.filter { state.partitions.held.contains($0) } }
            let pause = wanted.filter { !paused.contains($0) }
            let resume = partitions.filter { paused.contains($0) && !wanted.contains($0) }
            if !pause.isEmpty { consumer.pause(pause) }
            if !resume.isEmpty { consumer.resume(resume) }
            paused.formUnion(pause)
            paused.subtract(resume)
        }
    }

    /// Waits for in-flight work to end, up to the shutdown deadline.
    func drain() async {
        if await idle(within: .seconds(configuration.shutdownDeadlineSeconds)) || inFlight == 0 {
            logger.info("stopping: in-flight work finished")
        }
    }

    /// Waits until no intent is in flight (true; at once when none is), or until `timeout`
    /// passed first (false).
    public func idle(within timeout: Duration) async -> Bool {
        let id = state.withLock { state -> Int? in
            guard state.inFlight > 0 else { return nil }
            state.nextIdleWaiter += 1
            return state.nextIdleWaiter
        }
        guard let id else { return true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                // True when the last item's finish resumed it; false when the deadline did.
                await withCheckedContinuation { continuation in
                    // Cancelled (the deadline won) before it got here: nobody would resume it.
                    let done = self.state.withLock { state -> Bool? in
                        if state.inFlight == 0 { return true }
                        if Task.isCancelled { return false }
                        state.idleWaiters[id] = continuation
                        return nil
                    }
                    if let done { continuation.resume(returning: done) }
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            // The deadline won: the waiter (if it is in place yet) goes on now.
            let waiter = self.state.withLock { $0.idleWaiters.removeValue(forKey: id) }
            waiter?.resume(returning: false)
            return first
        }
    }
}
