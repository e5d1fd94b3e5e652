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

    /// Reads the consumer's events; each batch is parsed and grouped for its admission while
    /// the admitting task admits earlier ones, in order (each batch's reads go to Redis after
    /// the bucket writes of the batch before it).
    func consume() async {
        // Without Redis admitting takes no round trip: hand over one batch at a time (fewer
        // consumed messages held).
        let handOver = HandOver<Consumed>(capacity: policy == nil ? 1 : Self.admissionsUnderWay)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.admitConsumed(handOver) }
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
    }

    func admitConsumed(_ handOver: HandOver<Consumed>) async {
        while let next = await handOver.pop() {
            switch next {
            case .assigned(let partitions):
                state.withLock { $0.partitions.assign(partitions) }
                logger.info("partitions assigned", metadata: ["kafka.partitions": "\(partitions)"])
            case .revoked(let partitions):
                state.withLock { $0.partitions.revoke(partitions) }
                logger.info("partitions revoked", metadata: ["kafka.partitions": "\(partitions)"])
            case .batch(let batch, let parsed, let admitting):
                guard let admissions = await finishAdmission(parsed, admitting) else { return }
                for (index, message) in batch.enumerated() {
                    await waitForCapacity()
                    if Task.isCancelled { return }
                    admit(message, parsed[index], admissions[index])
                }
            }
            if Task.isCancelled { return }
        }
    }

    func waitForCapacity() async {
        let limit = configuration.limits.maxInFlight
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if state.inFlight < limit || Task.isCancelled { return true }
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
