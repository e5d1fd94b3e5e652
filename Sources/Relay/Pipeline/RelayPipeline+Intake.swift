import Common
import Kafka

extension RelayPipeline {
    /// Records of one lane from one consumed batch, parsed and grouped for their admission,
    /// with the generation each partition had when they were read (a record read before a
    /// revocation never starts under the partition's next assignment).
    struct LaneBatch: Sendable {
        let messages: [KafkaMessage]
        let parsed: [Result<Intent, InvalidIntent>]
        let admitting: Admitting
        let generations: [TopicPartition: Int]
        /// When the consumer handed the records over: an intent's latency runs from here, its
        /// wait for room and for admission included.
        let consumedAt: ContinuousClock.Instant
    }

    /// Batches parsed and grouped ahead of a lane's admitting task, with one lane.
    static let admissionsUnderWay = 2

    /// With several lanes, a lane's records consumed and not admitted yet, at most (the
    /// consumer takes no more from its topic's queue meanwhile).
    static let laneBacklogLimit = 4000

    /// Consecutive intents whose work shares one task group (see ``admitLane(_:from:gate:)``).
    /// Measured with `bench e2e` against 32 (docs/performance.md): 7–9% more intents/s with the
    /// policy on, about the same without it, for a higher latency at saturation (p50 about 25
    /// instead of 5 ms, against about 90 ms with one group for every intent).
    static let workGroupSize = 128

    /// Consumes and admits until the relay stops, and runs every admitted intent's work in a
    /// child task; once the shutdown deadline passed (``abandoning``), cancels what is left.
    ///
    /// One task reads the consumer: it applies rebalances to the ledger at once, and parses
    /// each batch and groups it for its admission, by lane, while each lane's admitting task
    /// admits earlier ones, in order. With one lane the reader waits for its admitting task
    /// (one batch ahead without Redis, two with); with several it never waits: the consumer
    /// hands over no more of a lane's records while `laneBacklogLimit` of them wait here
    /// (``KafkaConsumer/release(topic:records:)``), so a busy lane's records never stand in
    /// front of another's. Admissions ask Redis one batch at a time, whatever the lane (each
    /// batch's reads go to Redis after the bucket writes of the batch before).
    func consumeAndWork() async {
        let queues = laneTopics.map { _ in AsyncBoundedQueue<LaneBatch>(capacity: policy == nil ? 1 : Self.admissionsUnderWay) }
        let gate = AsyncSerialGate()
        await withDiscardingTaskGroup { workers in
            workers.addTask {
                await withTaskGroup(of: Void.self) { reading in
                    reading.addTask { await self.read(into: queues) }
                    await self.stopping.wait()
                    reading.cancelAll()
                }
                for queue in queues { queue.finish() }
            }
            for (lane, queue) in queues.enumerated() {
                workers.addTask { await self.admitLane(lane, from: queue, gate: gate) }
            }
            await abandoning.wait()
            workers.cancelAll()
        }
    }

    /// With several lanes, the partition numbers each lane's topic has in `owned`, when they
    /// are not the same for every lane (nil when they are): then a device's intents of two lanes
    /// can be another relay's too (`partition.assignment.strategy` set to other than `range`,
    /// or lanes with different partition counts).
    static func lanesApart(_ owned: [TopicPartition], _ laneTopics: [String]) -> [String: [Int32]]? {
        guard laneTopics.count > 1 else { return nil }
        var numbers: [String: [Int32]] = Dictionary(uniqueKeysWithValues: laneTopics.map { ($0, []) })
        for partition in owned { numbers[partition.topic]?.append(partition.partition) }
        let sets = numbers.mapValues { $0.sorted() }
        return Set(sets.values).count > 1 ? sets : nil
    }

    /// Reads the consumer's events until cancelled: rebalances go to the ledger, records to
    /// their lanes' queues.
    private func read(into queues: [AsyncBoundedQueue<LaneBatch>]) async {
        events: for await event in consumer.events {
            switch event {
            case .assigned(let partitions):
                await assign(partitions)
                let owned = self.owned
                logger.info("partitions assigned", metadata: ["kafka.partitions": "\(partitions)"])
                if let apart = Self.lanesApart(owned, laneTopics) {
                    logger.warning("a device's lanes may be consumed by two relays: this relay owns different partitions of its lanes (see docs/lanes.md, Order)",
                                   metadata: ["kafka.partitions": "\(apart)"])
                }
            case .revoked(let partitions):
                let failures = consumer.revocationCommitFailures
                await revoke(partitions)
                let uncounted = revocation.commitFailuresNotCounted(failures)
                // The consumer resumed them as it let them go. A pause asked for one of them
                // after the consumer revoked it (a hold of its old assignment, late) could have
                // reached the consumer after it was assigned again: that wish ends here.
                let asked = pauses.withLock { paused in
                    defer { paused.subtract(partitions) }
                    return partitions.filter(paused.contains)
                }
                if !asked.isEmpty { consumer.resume(asked) }
                if uncounted > 0 { RelayMetrics.revocationCommitFailures.increment(by: uncounted) }
                logger.info("partitions revoked", metadata: ["kafka.partitions": "\(partitions)"])
            case .messages(let batch):
                let consumedAt = ContinuousClock.now
                // One reading of the wall clock for the batch: what an intent's TTL counts from.
                let now = clock()
                for (lane, messages) in lanes(of: batch) {
                    let parsed = messages.map { parse($0, now: now) }
                    // As the shards published them: only this task assigns and revokes, so they
                    // are the ledgers' own.
                    var generations: [TopicPartition: Int] = [:]
                    var last: TopicPartition?
                    for message in messages where message.topicPartition != last {
                        last = message.topicPartition
                        if generations[message.topicPartition] == nil {
                            generations[message.topicPartition] =
                                shard(of: message.topicPartition).publishedPartitions.generations[message.topicPartition] ?? -1
                        }
                    }
                    if shards.count > 1 {
                        let across = Self.acrossShards(messages.map { shardIndex(generations[$0.topicPartition]) }, parsed)
                        if across > 0 { intentsAcrossShards.add(across, ordering: .relaxed) }
                    }
                    state.withLock { $0.lanes.consumed(lane, records: messages.count) }
                    let laneBatch = LaneBatch(messages: messages, parsed: parsed, admitting: await startAdmission(parsed), generations: generations,
                                              consumedAt: consumedAt)
                    if queues.count == 1 {
                        guard await queues[lane].push(laneBatch) else { break events }
                    } else {
                        guard queues[lane].offer(laneBatch) != nil else { break events }
                    }
                }
            case .error(let error):
                logger.warning("consumer error", metadata: ["kafka.error": "\(error)"])
            }
            if Task.isCancelled { break events }
        }
        for queue in queues { queue.finish() }
    }

    /// The shard of a record whose partition had `generation` when it was read: the one that
    /// handed the generation out (nil without one: the partition was not ours, its record is
    /// dropped).
    func shardIndex(_ generation: Int?) -> Int? {
        generation.flatMap { $0 < 0 ? nil : Self.shardIndex(ofGeneration: $0, shards: shards.count) }
    }

    /// Intents of one lane's consumed batch whose device (or channel) has an earlier intent in
    /// the batch from a partition number of another shard (`shards`: each record's, nil for a
    /// partition not ours): a pair the shards' queues cannot see
    /// (``DeviceQueues/acrossPartitions`` counts those of one shard). Counted per batch, so that
    /// `apns_relay_intents_across_partitions_total` sees a producer that does not key by device
    /// whatever the shard count.
    static func acrossShards(_ shards: [Int?], _ parsed: [Result<Intent, InvalidIntent>]) -> Int {
        // A batch of one shard's partitions (often all of it) has no such pair.
        guard let shard = shards.first, shards.contains(where: { $0 != shard }) else { return 0 }
        var first: [String: Int] = [:]
        first.reserveCapacity(parsed.count)
        var across = 0
        for (shard, intent) in zip(shards, parsed) {
            guard let shard, case .success(let intent) = intent else { continue }
            if let earlier = first[intent.recipient] {
                if earlier != shard { across += 1 }
            } else {
                first[intent.recipient] = shard
            }
        }
        return across
    }

    /// A consumed batch's records by lane, each lane's in their order.
    private func lanes(of batch: [KafkaMessage]) -> [(lane: Int, messages: [KafkaMessage])] {
        guard laneTopics.count > 1 else { return batch.isEmpty ? [] : [(0, batch)] }
        var byLane: [[KafkaMessage]] = Array(repeating: [], count: laneTopics.count)
        for message in batch { byLane[lane(of: message.topic)].append(message) }
        return byLane.enumerated().compactMap { $0.element.isEmpty ? nil : ($0.offset, $0.element) }
    }

    /// Admits a lane's batches, in consumption order, until the relay stops: each admitted
    /// intent that can start now runs in a child task of a group of intents.
    private func admitLane(_ lane: Int, from queue: AsyncBoundedQueue<LaneBatch>, gate: AsyncSerialGate) async {
        var batches = lane
        await withDiscardingTaskGroup { workers in
            while let batch = await queue.pop(), !stopping.isOpen {
                guard case (var admissions, let forgetsUnregistered)? = await gate.run({ await self.finishAdmission(batch.parsed, batch.admitting) }) ?? nil
                else { return }
                let decisions = self.applyPolicyMode(&admissions, batch.parsed)
                let admitting = batch.admitting
                let readMarks = admitting.read?.marks
                let policy = tracer != nil && admitting.pending != nil ? (start: admitting.startedAt, end: wallNanoseconds()) : nil
                // Intents run in task groups of their own, up to `workGroupSize` consecutive
                // intents of one shard each, on that shard's event loop (where its APNs client
                // prefers a connection): a finished child task is unlinked by walking its group's
                // list of children, and intents end out of order (each partition's outcomes are
                // acknowledged together), so one group of every intent in flight made that walk
                // thousands of tasks long. The shards' groups take turns, and each group admits
                // its own intents, in order, before the next group starts: a group waits for its
                // turn on a busy event loop, which keeps fewer intents waiting in flight when the
                // relay is saturated.
                let messages = batch.messages
                let consumedAt = batch.consumedAt
                let groups = Self.workGroups(messages.map { shardIndex(batch.generations[$0.topicPartition]) }, shards: shards.count,
                                             first: batches % shards.count)
                batches &+= 1
                for (shard, indices) in groups {
                    // A group lives until its last intent ends: it holds its own messages only,
                    // not the batch's.
                    let members = indices.map { index -> Member in
                        Member(message: messages[index], parsed: batch.parsed[index], admission: admissions[index],
                               forgetsUnregistered: forgetsUnregistered[index], generation: batch.generations[messages[index].topicPartition],
                               decision: decisions[index])
                    }
                    let admitted = AsyncLatch()
                    workers.addTask(executorPreference: shardExecutor(shard)) {
                        await withDiscardingTaskGroup { intents in
                            defer { admitted.open() }
                            for member in members {
                                await self.waitForCapacity(lane)
                                if self.stopping.isOpen || Task.isCancelled { return }
                                if let start = self.admit(member.message, member.parsed, member.admission, lane: lane,
                                                          generation: member.generation, policy: policy, consumedAt: consumedAt,
                                                          readMarks: readMarks, policyDecision: member.decision,
                                                          forgetsUnregistered: member.forgetsUnregistered) {
                                    if !self.driveByCallbacks(start) { intents.addTask { await self.work(start) } }
                                }
                            }
                        }
                    }
                    await admitted.wait()
                    backlogTaken(lane, records: members.count)
                    if stopping.isOpen || Task.isCancelled { return }
                }
                // Every intent of the batch admitted: its read no longer keeps answers.
                admitting.read?.end()
            }
        }
    }

    /// A batch's work groups: each shard's records (`shards`, each record's shard; nil for a
    /// partition not ours, whose record is dropped at its admission, grouped with shard 0's) in
    /// their order, `workGroupSize` at most per group, the shards' groups in turn from shard
    /// `first` (batches take turns at going first: no shard's intents wait for the others' to
    /// be admitted in every batch).
    static func workGroups(_ recordShards: [Int?], shards: Int, first: Int = 0) -> [(shard: Int, indices: ArraySlice<Int>)] {
        var byShard: [[Int]] = Array(repeating: [], count: shards)
        for (index, shard) in recordShards.enumerated() { byShard[shard ?? 0].append(index) }
        let order = (0..<shards).map { (first + $0) % shards }
        var groups: [(shard: Int, indices: ArraySlice<Int>)] = []
        var start = 0
        while true {
            var any = false
            for shard in order where start < byShard[shard].count {
                let indices = byShard[shard]
                groups.append((shard, indices[start..<min(start + workGroupSize, indices.count)]))
                any = true
            }
            guard any else { return groups }
            start += workGroupSize
        }
    }

    /// One record of a work group, as admitted.
    private struct Member: Sendable {
        let message: KafkaMessage
        let parsed: Result<Intent, InvalidIntent>
        let admission: Admission
        let forgetsUnregistered: Bool
        let generation: Int?
        let decision: String?
    }

    /// Records of a lane's backlog were admitted: the consumer may hand over more of its topic,
    /// and a lane no longer pressing leaves its share to the others.
    private func backlogTaken(_ lane: Int, records: Int) {
        let waiters = state.withLock { state in
            state.lanes.taken(lane, records: records)
            return state.lanes.waitersWithRoom()
        }
        for waiter in waiters { waiter.resume() }
        consumer.release(topic: laneTopics[lane], records: records)
    }

    /// Whether `lane`'s admitting task goes on without waiting: there is room, or it is to stop.
    private func mayGoOn(_ state: State, _ lane: Int) -> Bool {
        state.lanes.hasRoom(lane) || Task.isCancelled || stopping.isOpen
    }

    /// Waits until `lane` may admit another intent (``LaneLedger/hasRoom(_:)``).
    func waitForCapacity(_ lane: Int) async {
        // Usually there is room: no continuation, no cancellation handler.
        if state.withLock({ mayGoOn($0, lane) }) { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if mayGoOn(state, lane) { return true }
                    state.lanes.wait(lane, continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.lanes.takeWaiter(lane) }?.resume()
        }
    }

    /// The intent a message holds, or why it is invalid: what ``Intent/parse(_:key:now:defaultTTL:)``
    /// refuses, and an MDM push whose topic's credential is not a certificate
    /// (`MDMNeedsCertificate`: APNs takes MDM pushes on certificate connections only).
    func parse(_ message: KafkaMessage, now: Int64) -> Result<Intent, InvalidIntent> {
        let intent: Intent
        do {
            intent = try Intent.parse(message.value, key: message.key, now: now, defaultTTL: configuration.defaults.expirationSeconds)
        } catch {
            return .failure(error)
        }
        if intent.pushType == .mdm, let index = credentials.index(forTopic: intent.topic), certificates[index] == nil {
            return .failure(InvalidIntent(reason: "MDMNeedsCertificate",
                                          message: "MDM pushes go out with a certificate credential; \(intent.topic)'s is a token",
                                          id: intent.id, token: intent.token, topic: intent.topic))
        }
        return .success(intent)
    }
}
