import Kafka


extension RelayPipeline {
    /// Ends an item: its offset becomes committable once it and every earlier one are done.
    ///
    /// The offset is stored inside the state lock: two items finishing at once must store their
    /// positions in order (a later store of an older position would move the commit back), and
    /// the drain that waits for the last item must find its offset stored.
    func finish(_ item: WorkItem, stored: Bool) {
        var release = false
        let (notStored, waiters, inFlight) = state.withLock { state -> (Int64?, [CheckedContinuation<Void, Never>], Int) in
            state.inFlight -= 1
            if let member = item.mailboxMember { state.mailboxJobs.remove(member) }
            var notStored: Int64?
            // Intents from a mailbox had their offsets stored when they were parked.
            if stored, item.mailboxMember == nil,
               let committable = state.partitions.finish(item.partition, generation: item.generation, offset: item.offset) {
                do {
                    try consumer.storeOffset(item.partition, offset: committable)
                } catch {
                    notStored = committable
                }
                release = state.partitions.releaseIfDrained(item.partition)
            }
            var waiters: [CheckedContinuation<Void, Never>] = []
            if let waiter = capacityWaiterIfRoom(&state) { waiters.append(waiter) }
            if state.inFlight == 0, let waiter = state.drainedWaiter {
                state.drainedWaiter = nil
                waiters.append(waiter)
            }
            return (notStored, waiters, state.inFlight)
        }
        if let notStored {
            logger.info("offset not stored (partition no longer ours)", metadata: [
                "kafka.partition": "\(item.partition.partition)", "kafka.offset": "\(notStored)",
            ])
        }
        RelayMetrics.inFlight.record(inFlight)
        for waiter in waiters { waiter.resume() }
        if release { released(item.partition) }
    }

    /// A partition reached `limits.max_uncommitted_per_partition`: paused until half of its
    /// offsets are committable.
    func held(_ partition: TopicPartition) {
        consumer.pause([partition])
        RelayMetrics.partitionsHeld.record(state.withLock { $0.partitions.held.count })
        logger.warning("partition paused: too many offsets wait behind an unfinished intent", metadata: [
            "kafka.partition": "\(partition.partition)", "relay.limit": "\(configuration.limits.maxUncommittedPerPartition)",
        ])
    }

    func released(_ partition: TopicPartition) {
        consumer.resume([partition])
        RelayMetrics.partitionsHeld.record(state.withLock { $0.partitions.held.count })
        logger.info("partition resumed", metadata: ["kafka.partition": "\(partition.partition)"])
    }

    /// Waits for in-flight work to end, up to the shutdown deadline.
    func drain() async {
        let deadline = Duration.seconds(configuration.shutdownDeadlineSeconds)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let done = self.state.withLock { state -> Bool in
                        if state.inFlight == 0 { return true }
                        state.drainedWaiter = continuation
                        return false
                    }
                    if done { continuation.resume() }
                }
            }
            group.addTask { try? await Task.sleep(for: deadline) }
            await group.next()
            group.cancelAll()
            // Release the drain waiter if the deadline won.
            let waiter = self.state.withLock { state in
                defer { state.drainedWaiter = nil }
                return state.drainedWaiter
            }
            waiter?.resume()
        }
        if inFlight == 0 { logger.info("stopping: in-flight work finished") }
    }
}
