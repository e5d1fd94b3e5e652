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

    /// Ends items, as many as one poll's delivery reports concluded, in one step per shard (on
    /// its loop: a chunk of reports is one shard's) and one offset store
    /// (``KafkaConsumer/storeOffsets(_:)``) per shard;
    /// with `thenNext`, ends their turns in their devices' queues too and returns the items
    /// queued behind them, to start now (as ``nextInQueue(after:parkedUntil:)`` does, with
    /// nothing parked).
    ///
    /// The offsets are stored in the shard's step: its finishes run one after another on its
    /// loop, so they store their positions in order (a later store of an older position would
    /// move the commit back); and before the items' slots are freed: the drain that waits for
    /// the last item must find its offset stored.
    @discardableResult
    func finish(_ items: [Finished], thenNext: Bool) -> [WorkItem] {
        for finished in items {
            // Its spans end here if no outcome ended them (parked: stored without one).
            finished.item.traced?.end(without: finished.stored ? "parked" : "unfinished")
        }
        var released: [TopicPartition] = []
        var revokeWaiter: DispatchSemaphore?
        var notStored: [(partition: TopicPartition, offset: Int64)] = []
        var next: [WorkItem] = []
        var waiters: [CheckedContinuation<Void, Never>] = []
        var idleWaiters: [CheckedContinuation<Bool, Never>] = []
        var inFlight = Array(repeating: 0, count: items.count)
        // A shard's items in one step (a chunk of reports is one shard's; an item ended in a task
        // is alone).
        for box in shards {
            // The items of this shard's partitions (no array of them: one fewer allocation a call).
            guard items.contains(where: { belongs($0.item, to: box) }) else { continue }
            box.withState { shard in
                // The newest committable offset of each partition the items moved (a later finish
                // of a partition only moves it further).
                var committable: [(partition: TopicPartition, offset: Int64)] = []
                var settled = false
                for index in items.indices where belongs(items[index].item, to: box) {
                    let finished = items[index], item = finished.item
                    // Intents from a mailbox had their offsets stored when they were parked.
                    if finished.stored, item.mailboxMember == nil,
                       let offset = shard.partitions.finish(item.partition, generation: item.generation, offset: item.offset) {
                        if let index = committable.firstIndex(where: { $0.partition == item.partition }) {
                            committable[index].offset = offset
                        } else {
                            committable.append((item.partition, offset))
                        }
                    }
                    if finished.sent, Self.endAtAPNs(item, &shard) { settled = true }
                }
                // In the shard's step, where every finish of these partitions runs; before
                // the items' slots are freed, so that a drain that waits for the last of them
                // finds its offset stored.
                let failed = consumer.storeOffsets(committable)
                notStored += failed.compactMap { failure in committable.first { $0.partition == failure.0 } }
                let releasedBefore = released.count
                for (partition, _) in committable where shard.partitions.releaseIfDrained(partition) { released.append(partition) }
                if released.count > releasedBefore { box.publish(shard) }
                state.withLock { state in
                    for index in items.indices where belongs(items[index].item, to: box) {
                        Self.freeSlot(of: items[index].item, &shard, &state)
                        if let member = items[index].item.mailboxMember { mailboxJobs.end(member) }
                    }
                    if settled, let waiter = revocation.settled(box.index) { revokeWaiter = waiter }
                    if thenNext {
                        for index in items.indices where belongs(items[index].item, to: box) {
                            if let turn = DeviceQueues.turn(of: items[index].item),
                               let queued = Self.nextQueued(after: items[index].item, turn, parkedUntil: [:], &shard, &state) { next.append(queued) }
                        }
                    }
                    waiters += state.lanes.waitersWithRoom()
                    if state.inFlight == 0, !state.idleWaiters.isEmpty {
                        idleWaiters += state.idleWaiters.values
                        state.idleWaiters.removeAll()
                    }
                    // Each item's lane's count (not the ledger's array: held past the lock, it would
                    // make the next change copy it).
                    for index in items.indices where belongs(items[index].item, to: box) { inFlight[index] = state.lanes.inFlight[items[index].item.lane] }
                }
            }
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

    /// The item no longer counts among its partition's work at APNs; true when that settled the
    /// partitions a revocation waits for on its shard (then, in the shard's step,
    /// ``RevocationCoordinator/settled(_:)`` returns the revocation's waiter to signal when it
    /// was the last shard to settle).
    static func endAtAPNs(_ item: WorkItem, _ shard: inout Shard) -> Bool {
        shard.partitions.sentWorkEnded(item.partition, generation: item.generation)
        guard !shard.revocationAwaits.isEmpty, shard.partitions.settled(shard.revocationAwaits) else { return false }
        shard.revocationAwaits = []
        return true
    }

    /// On the consumer's poll thread, before a revocation's commit: no new work of
    /// `partitions` starts from now on, and, unless the assignment was lost, this waits (up to
    /// the shutdown deadline, 60 s at most) until their requests at APNs were answered and
    /// concluded, their offsets stored, so that the commit covers them up to the partition's
    /// first unfinished intent and the next owner does not send them again.
    ///
    /// While Redis fails (without `redis.fail_open`), a relay that is not stopping goes on
    /// waiting, up to ``RevocationCoordinator/redisWaitLimitSeconds`` in all: the answers APNs gave wait for
    /// their records, and a partition moved before they land has its next owner, finding no
    /// record, send them again. The partitions could not go on elsewhere meanwhile anyway: their
    /// next owner needs Redis to admit anything. A stopping relay keeps the usual bound, which
    /// its pod's grace period counts on.
    func partitionsRevoking(_ partitions: [TopicPartition], lost: Bool) {
        revocation.begin()
        // Each shard's unsettled mark is set in a step on its loop: a shard that settles from then
        // on finds it (``RevocationCoordinator/settled(_:)``), before or after the waiter is in
        // place. Every shard is marked: a partition whose assignment still waits for the reader
        // has no shard yet (``revoke(_:)`` clears every shard's marks).
        for box in shards {
            let marked = box.onLoopWaiting(atMost: .seconds(RevocationCoordinator.waitLimitSeconds)) { shard in
                shard.partitions.markRevoking(partitions)
                shard.revocationAwaits = lost ? [] : partitions.filter { !shard.partitions.settled(CollectionOfOne($0)) }
                if !shard.revocationAwaits.isEmpty { self.revocation.unsettled(box.index) }
                box.publish(shard)
            }
            if !marked {
                // Its loop stopped turning: the marks land when it turns again, and work of these
                // partitions it starts before then may be sent again by their next owner.
                logger.error("a shard's event loop did not take a revocation's marks in time: the revocation goes on without them",
                             metadata: ["relay.shard": "\(box.index)", "relay.wait_seconds": "\(RevocationCoordinator.waitLimitSeconds)",
                                        "kafka.partitions": "\(partitions.map(\.partition))"])
            }
        }
        logger.info("partitions being revoked: their new work stops", metadata: [
            "kafka.partitions": "\(partitions.map(\.partition))", "kafka.assignment_lost": "\(lost)",
        ])
        guard !lost else { return }
        revocation.waitForWorkAtAPNs(partitions, awaitsRedis: { awaitsRedis }, stopping: { stopping.isOpen })
    }

    /// Whether a revocation waits for Redis past its usual bound (``partitionsRevoking(_:lost:)``):
    /// the calls work waits on (records, admissions) fail, not only the mailbox poll.
    private var awaitsRedis: Bool {
        !configuration.redis.failOpen && !stopping.isOpen && health.redisCallsFailing
    }

    /// A partition reached `limits.max_uncommitted_per_partition`: paused until half of its
    /// offsets are committable.
    func held(_ partition: TopicPartition) {
        reconcilePauses([partition])
        RelayMetrics.partitionsHeld.record(heldNow.count)
        logger.warning("partition paused: too many offsets wait behind an unfinished intent", metadata: [
            "kafka.partition": "\(partition.partition)", "relay.limit": "\(configuration.limits.maxUncommittedPerPartition)",
        ])
    }

    func released(_ partition: TopicPartition) {
        reconcilePauses([partition])
        RelayMetrics.partitionsHeld.record(heldNow.count)
        logger.info("partition resumed", metadata: ["kafka.partition": "\(partition.partition)"])
    }

    /// Pauses or resumes `partitions` so that exactly those the ledger holds (too many
    /// uncommitted offsets) stay paused. Each hold and release is followed by a call, and calls
    /// take turns (``pauses``, which also remembers what was applied), so the last one applies
    /// the last state whichever order the changes came in.
    func reconcilePauses(_ partitions: [TopicPartition]) {
        guard !partitions.isEmpty else { return }
        pauses.withLock { paused in
            // As the shards published them, in the step that held or released them.
            let wanted = partitions.filter { partition in shard(of: partition).publishedPartitions.held.contains(partition) }
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
