import ServiceLifecycle

/// A relay's run: consuming until asked to stop, then draining to the shutdown deadline and
/// flushing the producer (``run()``), and the consumer lag reported once a second meanwhile.
extension RelayPipeline {
    /// Asks ``run()`` to stop consuming and drain.
    public func requestStop() {
        stopping.open()
        // The admitting loop may wait for in-flight room: it stops instead.
        for waiter in state.withLock({ $0.lanes.takeAllWaiters() }) { waiter.resume() }
    }

    /// Consumes until ``requestStop()``, a graceful shutdown of its service group, or
    /// cancellation; then stops, in this order:
    ///
    /// 1. consuming and mailbox polling stop;
    /// 2. in-flight work finishes (its outcomes published, its offsets stored) until the
    ///    shutdown deadline; what is left then is cancelled: abandoned without an outcome, its
    ///    offsets not stored, so that it is consumed again;
    /// 3. the producer flushes.
    ///
    /// The clients are services of their own, after it in ``RelayApplication``'s group: the
    /// consumer commits and leaves the group once this returns, then the producer, the APNs
    /// clients and Redis close.
    ///
    /// Every intent's work runs in a child task of this one: for consumed intents, in the task
    /// group of its group of intents (a child of the admitting loop's task group, on its
    /// shard's event loop: see ``shards``), for intents taken from mailboxes in the ``MailboxDeliverer``'s (each
    /// on its shard's event loop), which cancels them when ``abandoning`` opens. So the deadline
    /// reaches all of it; cancelling this task cancels the consumed intents' work, and the
    /// deliverer's ends with its own service.
    ///
    /// The work runs in a task of its own that this one awaits and cancels with itself: one that
    /// inherits no task-local values (the service group's among them). Every intent's child
    /// task would otherwise link to them, and that link costs about 2.5 KB of task memory per
    /// intent in flight (25 MB at 10,000; heaptrack, docs/architecture.md).
    public func run() async {
        await runDetached { await self.runUntilStopped() }
    }

    /// Runs `work` in a detached task (no task-local values inherited, see ``run()``) that is
    /// cancelled with the calling one; a graceful shutdown of the service group asks the
    /// pipeline to stop. ``run()`` and the ``MailboxDeliverer`` run so.
    func runDetached(_ work: @escaping @Sendable () async -> Void) async {
        await withGracefulShutdownHandler {
            let task = Task.detached { await work() }
            await withTaskCancellationHandler {
                await task.value
            } onCancel: {
                task.cancel()
            }
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// The shutdown deadline: what is still running is cancelled, retries waiting out a backoff
    /// included.
    private func abandon() {
        abandoning.open()
        backoffTimers.abandonAll()
    }

    private func runUntilStopped() async {
        logger.info("relay started", metadata: ["relay.worker": "\(worker)", "kafka.topics": "\(configuration.kafka.intentTopics)"])
        guard await redisGuaranteesHold() else {
            // Nothing started: the mailbox deliverer stops too.
            requestStop()
            abandon()
            return
        }
        await prepareProducedTopics()
        consuming.open()
        let left = await withTaskGroup(of: Void.self) { group -> Int in
            group.addTask { await self.consumeAndWork() }
            group.addTask { await self.reportLag() }
            group.addTask { await self.watchRedisGuarantees() }
            await stopping.wait()
            logger.info("stopping: consuming stopped", metadata: ["relay.in_flight": "\(inFlight)"])
            await drain()
            // What is still in flight now is abandoned.
            let left = inFlight
            abandon()
            // Abandoned work waits for nothing: records still waiting for Kafka (an outcome, an
            // invalidation record) are purged, so their waits end now rather than when
            // librdkafka gives up on them (`message.timeout.ms`, 5 minutes by default). Their
            // offsets stay uncommitted: the next owner consumes them again. Again every 100 ms
            // for records a cancelled task handed over meanwhile.
            let purging = left == 0 ? nil : Task { [producer] in
                while !Task.isCancelled {
                    producer.purge()
                    try? await Task.sleep(for: .milliseconds(100))
                }
            }
            await group.waitForAll()
            await mailboxesEnded.wait()
            purging?.cancel()
            return left
        }
        if left > 0 {
            logger.warning("shutdown deadline passed with intents in flight: abandoned, their offsets stay uncommitted",
                           metadata: ["relay.in_flight": "\(left)"])
        }
        _ = await producer.flush(timeout: .seconds(10))
        // The reports the flush served were handed to the shards' loops
        // (``outcomesDelivered(_:)``): their items end (their offsets stored) before the run
        // ends and the consumer's last commit (a loop runs its tasks in order).
        var drained = Set<ObjectIdentifier>()
        for shard in shards where drained.insert(ObjectIdentifier(shard.loop)).inserted { try? await shard.loop.submit {}.get() }
        logger.info("stopping: outcomes flushed")
    }

    /// Consumer lag from librdkafka's cached positions and watermarks (no round trip), and the
    /// intents queued behind another partition's intent of their device since the last report
    /// (``DeviceQueues/acrossPartitions``, within a shard) or consumed beside one from another
    /// shard's partition (``intentsAcrossShards``), every second until the relay stops.
    private func reportLag() async {
        var acrossReported = 0
        while await !stopping.wait(atMost: .seconds(1)), !Task.isCancelled {
            RelayMetrics.consumerLag(consumer.lag, owned: Set(consumer.assignment))
            var across = intentsAcrossShards.load(ordering: .relaxed)
            for shard in shards { across += await shard.onLoop { $0.queues.acrossPartitions } }
            if across > acrossReported { RelayMetrics.intentsAcrossPartitions.increment(by: across - acrossReported) }
            acrossReported = across
        }
    }
}
