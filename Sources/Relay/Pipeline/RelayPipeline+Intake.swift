import Common
import Kafka

extension RelayPipeline {
    /// What consuming hands to admitting, in consumption order: batches, parsed and grouped for
    /// their admission, and rebalances (so they apply between the right batches).
    enum Consumed: Sendable {
        case batch([KafkaMessage], [Result<Intent, InvalidIntent>], Admitting)
        case assigned([TopicPartition])
        case revoked([TopicPartition])
    }

    /// Batches parsed and grouped ahead of the admitting task.
    static let admissionsUnderWay = 2

    /// Consecutive intents whose work shares one task group (see ``admitConsumed(_:workers:)``).
    /// Measured with `bench e2e` against 32 (docs/performance.md): 7–9% more intents/s with the
    /// policy on, about the same without it, for a higher latency at saturation (p50 about 25
    /// instead of 5 ms, against about 90 ms with one group for every intent).
    static let workGroupSize = 128

    /// Consumes and admits until the relay stops, and runs every admitted intent's work in a
    /// child task; once the shutdown deadline passed (``abandoning``), cancels what is left.
    ///
    /// Each batch is parsed and grouped for its admission by the reading task while this one
    /// admits earlier ones, in order (each batch's reads go to Redis after the bucket writes of
    /// the batch before it).
    func consumeAndWork() async {
        // Without Redis admitting takes no round trip: hand over one batch at a time (fewer
        // consumed messages held).
        let handOver = AsyncBoundedQueue<Consumed>(capacity: policy == nil ? 1 : Self.admissionsUnderWay)
        await withDiscardingTaskGroup { workers in
            workers.addTask {
                await withTaskGroup(of: Void.self) { reading in
                    reading.addTask { await self.read(into: handOver) }
                    await self.stopping.wait()
                    reading.cancelAll()
                }
                handOver.finish()
            }
            await admitConsumed(handOver, workers: &workers)
            await abandoning.wait()
            workers.cancelAll()
        }
    }

    /// Reads the consumer's events into `handOver` until cancelled.
    private func read(into handOver: AsyncBoundedQueue<Consumed>) async {
        events: for await event in consumer.events {
            let consumed: Consumed
            switch event {
            case .assigned(let partitions): consumed = .assigned(partitions)
            case .revoked(let partitions): consumed = .revoked(partitions)
            case .messages(let batch):
                let parsed = batch.map(parse)
                consumed = .batch(batch, parsed, startAdmission(parsed))
            case .error(let error):
                logger.warning("consumer error", metadata: ["kafka.error": "\(error)"])
                continue
            }
            guard await handOver.push(consumed), !Task.isCancelled else { break events }
        }
        handOver.finish()
    }

    /// Applies rebalances and admits batches, in consumption order, until the relay stops:
    /// each admitted intent that can start now runs in a child task of a group of intents, a
    /// child of `workers`.
    private func admitConsumed(_ handOver: AsyncBoundedQueue<Consumed>, workers: inout DiscardingTaskGroup) async {
        var groups = 0
        while let next = await handOver.pop(), !stopping.isOpen {
            switch next {
            case .assigned(let partitions):
                state.withLock { $0.partitions.assign(partitions) }
                logger.info("partitions assigned", metadata: ["kafka.partitions": "\(partitions)"])
            case .revoked(let partitions):
                let failures = consumer.revocationCommitFailures
                let uncounted = state.withLock { state in
                    state.partitions.revoke(partitions)
                    defer { state.revocationCommitFailuresCounted = failures }
                    return failures - state.revocationCommitFailuresCounted
                }
                if uncounted > 0 { RelayMetrics.revocationCommitFailures.increment(by: uncounted) }
                logger.info("partitions revoked", metadata: ["kafka.partitions": "\(partitions)"])
            case .batch(let batch, let parsed, let admitting):
                guard let admissions = await finishAdmission(parsed, admitting) else { return }
                let policy = tracer != nil && admitting.pending != nil ? (start: admitting.startedAt, end: wallNanoseconds()) : nil
                // Intents run in task groups of their own, `workGroupSize` consecutive intents
                // each, in children of `workers`: a finished child task is unlinked by walking
                // its group's list of children, and intents end out of order (each partition's
                // outcomes are acknowledged together), so one group of every intent in flight
                // made that walk thousands of tasks long. Groups run on the work executors in
                // turn, and each group admits its own intents, in order, before the next group
                // starts: a group waits for its turn on a busy event loop, which keeps fewer
                // intents waiting in flight when the relay is saturated.
                for chunk in stride(from: 0, to: batch.count, by: Self.workGroupSize) {
                    // A group lives until its last intent ends: it holds its own messages only,
                    // not the batch's.
                    let members = (chunk..<min(chunk + Self.workGroupSize, batch.count)).map {
                        (message: batch[$0], parsed: parsed[$0], admission: admissions[$0])
                    }
                    let admitted = AsyncLatch()
                    let executor = workExecutors.isEmpty ? nil : workExecutors[groups % workExecutors.count]
                    groups &+= 1
                    workers.addTask(executorPreference: executor) {
                        await withDiscardingTaskGroup { intents in
                            defer { admitted.open() }
                            for member in members {
                                await self.waitForCapacity()
                                if self.stopping.isOpen || Task.isCancelled { return }
                                if let start = self.admit(member.message, member.parsed, member.admission, policy: policy) {
                                    intents.addTask { await self.work(start) }
                                }
                            }
                        }
                    }
                    await admitted.wait()
                    if stopping.isOpen || Task.isCancelled { return }
                }
            }
            if Task.isCancelled { return }
        }
    }

    /// Whether another intent may be admitted: fewer than `limits.max_in_flight` under way and
    /// fewer than `limits.max_waiting` waiting behind their devices.
    func hasRoom(_ state: State) -> Bool {
        state.inFlight - state.waiting < configuration.limits.maxInFlight && state.waiting < configuration.limits.maxWaiting
    }

    /// The admitting loop's continuation, taken out of the state when there is room for it.
    func capacityWaiterIfRoom(_ state: inout State) -> CheckedContinuation<Void, Never>? {
        guard hasRoom(state), let waiter = state.capacityWaiter else { return nil }
        state.capacityWaiter = nil
        return waiter
    }

    /// Whether the admitting loop goes on without waiting: there is room, or it is to stop.
    private func mayGoOn(_ state: State) -> Bool {
        hasRoom(state) || Task.isCancelled || stopping.isOpen
    }

    func waitForCapacity() async {
        // Usually there is room: no continuation, no cancellation handler.
        if state.withLock({ mayGoOn($0) }) { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if mayGoOn(state) { return true }
                    state.capacityWaiter = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.capacityWaiter = nil }
                return state.capacityWaiter
            }
            waiter?.resume()
        }
    }

    func parse(_ message: KafkaMessage) -> Result<Intent, InvalidIntent> {
        do {
            return .success(try Intent.parse(message.value, key: message.key, now: clock(),
                                             defaultTTL: configuration.defaults.expirationSeconds))
        } catch {
            return .failure(error)
        }
    }
}
