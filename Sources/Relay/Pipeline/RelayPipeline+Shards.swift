import APNs
import Common
import Dispatch
import Kafka
import NIOCore
import NIOPosix
import Synchronization

extension RelayPipeline {
    /// What one shard owns: the partitions routed to it (their offset trackers, generations,
    /// holds, revocations and work at APNs) and the queues of the devices whose intents come on
    /// them, with the recent answers and parks those queues' admissions check.
    ///
    /// A partition's shard is where its number was placed as it was assigned (``ShardPlacement``):
    /// partition N of every lane is on one shard, so a device's intents — keyed by its token, on
    /// one partition number of each lane (docs/intents.md) — meet in one shard's queues. Intents
    /// of one device that arrive on two partition numbers of different shards are not
    /// serialized with each other. An item belongs to the shard that admitted it, which its
    /// generation names (``shard(of:)``, given the item).
    ///
    /// Confined to the shard's event loop (``ShardBox``). A step that changes it and the
    /// relay-wide ``State`` takes the latter's lock inside it; a step that touches only a
    /// shard's partitions — whether an item's partition is still ours, a send counted at APNs —
    /// takes no lock (but the revocation coordinator's, when the end of a send settles a
    /// revocation that waits). No step touches two shards' states.
    struct Shard {
        var partitions: PartitionLedger<TopicPartition>
        var queues: DeviceQueues<WorkItem>
        /// The partitions a revocation waits for on this shard, those with work at APNs when it
        /// began (the shard marked unsettled in the ``RevocationCoordinator``): the end of their
        /// last work takes the coordinator's lock, once. Empty when none. Not the shard's other
        /// revoking partitions: an earlier revocation that gave up, its partitions still marked
        /// until the reader has it, is not waited for again.
        var revocationAwaits: [TopicPartition] = []
    }

    /// A shard: its state and its items whose outcomes are on their way to Kafka by callbacks,
    /// both confined to its event loop, with no lock; a copy of what others read of its
    /// partitions (``published``); and, when asked for (`bench e2e`), the count of its state's
    /// turns and of the hops to its loop they took (``shardTurns``).
    ///
    /// Every access to its state or its slots checks that it runs on its loop (a precondition,
    /// in release builds too, ``NIOLoopBoundBox``): a path that reaches them from elsewhere stops
    /// at once instead of racing. Work that starts elsewhere hands itself to the loop: an async
    /// caller (the reader, the mailbox poll, the lag report) with ``onLoop(_:)``, the
    /// consumer's poll thread with ``onLoopWaiting(atMost:_:)``, a callback (an APNs answer on another
    /// loop's connection, a Redis reply, a delivery report) with the loop's `execute`.
    final class ShardBox: Sendable {
        let index: Int
        /// Its event loop, where its admissions, its answers, its items' turns, its outcomes'
        /// slots and their delivery reports are handled.
        let loop: any EventLoop
        /// The task executor of ``loop``: a task preferring it runs there.
        let executor: EventLoopTaskExecutor
        private let state: NIOLoopBoundBox<Shard>
        /// Its items whose outcomes are on their way to Kafka by callbacks, under the slots their
        /// records' delivery reports name (``RelayPipeline/outcomeSlot(_:)``). Confined to
        /// ``loop``, as the state is.
        let concluding: NIOLoopBoundBox<SlotTable<Concluding>>
        /// What others read of its partitions (the status pages, the partitions-held gauge, the
        /// pauses asked of the consumer, the mailbox poll, tests): written on its loop in the
        /// step that changed them (an assignment, a revocation, a hold or a release, never per
        /// intent), read anywhere.
        private let published = Locked(Published())
        private let countsTurns: Bool
        private let turns = Atomic<Int>(0)
        private let hops = Atomic<Int>(0)

        /// What others read of a shard's partitions: a copy of its ledger's owned partitions
        /// with their generations, those being revoked and those held.
        struct Published: Sendable {
            var generations: [TopicPartition: Int] = [:]
            var revoking: Set<TopicPartition> = []
            var held: Set<TopicPartition> = []

            /// ``PartitionLedger/owns(_:generation:)``, as published.
            func owns(_ partition: TopicPartition, generation: Int) -> Bool {
                generations[partition] == generation
            }

            /// ``PartitionLedger/isActive(_:generation:)``, as published.
            func isActive(_ partition: TopicPartition, generation: Int) -> Bool {
                owns(partition, generation: generation) && !revoking.contains(partition)
            }
        }

        init(index: Int, executor: EventLoopTaskExecutor, countsTurns: Bool = false, _ shard: consuming sending Shard) {
            self.index = index
            self.loop = executor.eventLoop
            self.executor = executor
            self.countsTurns = countsTurns
            self.state = .makeBoxSendingValue(shard, eventLoop: executor.eventLoop)
            self.concluding = .makeBoxSendingValue(SlotTable(), eventLoop: executor.eventLoop)
        }

        /// Runs `body` with the shard's state: on its loop only.
        func withState<Result, E: Error>(_ body: (inout Shard) throws(E) -> Result) throws(E) -> Result {
            if countsTurns { turns.add(1, ordering: .relaxed) }
            return try state.withValue(body)
        }

        /// Runs `body` with the shard's state on its loop: at once when called there, else handed
        /// to the loop (a hop), which this waits for.
        func onLoop<Result: Sendable>(_ body: @escaping @Sendable (inout Shard) -> Result) async -> Result {
            if loop.inEventLoop { return withState(body) }
            if countsTurns { hops.add(1, ordering: .relaxed) }
            do {
                return try await loop.submit { self.withState(body) }.get()
            } catch {
                // NIO's shared loops, which the shards run on, are never shut down.
                preconditionFailure("shard \(index)'s event loop refused work: \(error)")
            }
        }

        /// ``onLoop(_:)`` from a thread that is not an event loop (the consumer's poll thread,
        /// which librdkafka blocks in its rebalance callback anyway), blocking it meanwhile, for
        /// `limit` at most: false when the loop had not run the step by then (it runs it once it
        /// gets there). Only a loop that stopped turning makes it wait that long.
        func onLoopWaiting(atMost limit: Duration, _ body: @escaping @Sendable (inout Shard) -> Void) -> Bool {
            if loop.inEventLoop {
                withState(body)
                return true
            }
            if countsTurns { hops.add(1, ordering: .relaxed) }
            let done = DispatchSemaphore(value: 0)
            loop.execute {
                self.withState(body)
                done.signal()
            }
            return done.wait(timeout: .now() + .nanoseconds(Int(limit.totalNanoseconds))) == .success
        }

        /// Publishes `shard`'s partitions for readers off its loop: in the step that changed
        /// which are owned, revoking or held, before it ends.
        func publish(_ shard: Shard) {
            let ledger = shard.partitions
            var generations: [TopicPartition: Int] = [:]
            for (partition, generation) in ledger.owned(where: { _ in true }) { generations[partition] = generation }
            let next = Published(generations: generations, revoking: ledger.revoking, held: ledger.held)
            published.withLock { $0 = next }
        }

        /// Its partitions as last published.
        var publishedPartitions: Published { published.withLock { $0 } }

        /// Its state's turns so far, and the hops to its loop they took.
        var stateTurns: (all: Int, hops: Int) {
            (turns.load(ordering: .relaxed), hops.load(ordering: .relaxed))
        }
    }

    /// The shards' state turns so far, and the hops to a shard's loop they took (from the
    /// reader, the mailbox poll, the consumer's poll thread): `bench e2e` prints them per
    /// intent. Zero unless ``RelayApplication`` was asked to count them.
    public var shardTurns: (all: Int, hops: Int) {
        shards.reduce((0, 0)) { sum, shard in (sum.0 + shard.stateTurns.all, sum.1 + shard.stateTurns.hops) }
    }

    /// The shard that owns `partition` now: where its number was placed (``ShardPlacement``),
    /// the same for every lane.
    func shard(of partition: TopicPartition) -> ShardBox {
        shards.count == 1 ? shards[0] : shards[placement.withLock { $0.shard(of: partition.partition) }]
    }

    /// The shard `item` was admitted on, which its generation names: it ends there even when
    /// its partition has moved since.
    func shard(of item: WorkItem) -> ShardBox {
        shards[Self.shardIndex(ofGeneration: item.generation, shards: shards.count)]
    }

    /// The event loop of `item`'s shard.
    func shardLoop(of item: WorkItem) -> any EventLoop {
        shard(of: item).loop
    }

    /// The task executor of `item`'s shard's event loop: a task preferring it runs there, where
    /// its shard's state is.
    func shardExecutor(of item: WorkItem) -> EventLoopTaskExecutor {
        shard(of: item).executor
    }

    /// The task executor of shard `index`'s event loop.
    func shardExecutor(_ index: Int) -> EventLoopTaskExecutor {
        shards[index].executor
    }

    /// The event loop of shard `index`.
    func shardLoop(_ index: Int) -> any EventLoop {
        shards[index].loop
    }

    /// The index of the shard that handed out `generation` among `shards` shards.
    static func shardIndex(ofGeneration generation: Int, shards: Int) -> Int {
        PartitionLedger<TopicPartition>.shard(ofGeneration: generation, shards: shards)
    }

    /// Whether `item` is `shard`'s.
    func belongs(_ item: WorkItem, to shard: ShardBox) -> Bool {
        shards.count == 1 || self.shard(of: item) === shard
    }

    /// The partitions this relay owns now, of every shard (as each last published them).
    var owned: [TopicPartition] {
        shards.flatMap { $0.publishedPartitions.generations.keys }
    }

    /// The partitions held now (too many uncommitted offsets), of every shard (as each last
    /// published them).
    var heldNow: Set<TopicPartition> {
        shards.reduce(into: []) { held, shard in held.formUnion(shard.publishedPartitions.held) }
    }

    /// The partitions are ours (the reader's `.assigned`): their numbers are placed on shards
    /// (``ShardPlacement``), and each shard's ledger takes its part, on the shard's loop.
    func assign(_ partitions: [TopicPartition]) async {
        let indices = placement.withLock { placement in
            placement.assign(partitions.map { ($0.topic, $0.partition) })
            return partitions.map { placement.shard(of: $0.partition) }
        }
        var parts: [[TopicPartition]] = Array(repeating: [], count: shards.count)
        for (partition, index) in zip(partitions, indices) { parts[index].append(partition) }
        for (box, part) in zip(shards, parts) where !part.isEmpty {
            await box.onLoop { shard in
                shard.partitions.assign(part)
                box.publish(shard)
            }
        }
    }

    /// The partitions are no longer ours (the reader's `.revoked`): every shard's ledger lets
    /// them go, and a number with no partition left is free to be placed anew.
    ///
    /// Every shard's, as every shard was marked revoking (``partitionsRevoking(_:lost:)``):
    /// librdkafka revokes on its poll thread, where an assignment can still wait behind consumed
    /// batches for the reader, its number not placed yet, so the shard a partition's mark went
    /// to need not be the one its assignment then went to.
    func revoke(_ partitions: [TopicPartition]) async {
        for box in shards {
            await box.onLoop { shard in
                shard.partitions.revoke(partitions)
                box.publish(shard)
            }
        }
        placement.withLock { $0.revoke(partitions.map { ($0.topic, $0.partition) }) }
    }

    // An item's partition, asked of its shard alone: on its loop, with no lock; off it, from
    // what the shard published (under that copy's lock).

    /// Whether the item's partition is still ours (being revoked included): work that reached
    /// APNs goes on to its outcome and stored offset.
    /// Off its shard's loop (the mailbox poll's hand-overs, say), as its shard last published it.
    func isCurrent(_ item: WorkItem) -> Bool {
        let box = shard(of: item)
        guard box.loop.inEventLoop else { return box.publishedPartitions.owns(item.partition, generation: item.generation) }
        return box.withState { $0.partitions.owns(item.partition, generation: item.generation) }
    }

    /// Whether new work of the item may start: its partition is ours and not being revoked.
    /// Off its shard's loop, as its shard last published it.
    func isActive(_ item: WorkItem) -> Bool {
        let box = shard(of: item)
        guard box.loop.inEventLoop else { return box.publishedPartitions.isActive(item.partition, generation: item.generation) }
        return box.withState { $0.partitions.isActive(item.partition, generation: item.generation) }
    }

    /// Whether the delivery may go to APNs now (its partition is ours and not being revoked);
    /// the first time, it is counted among its partition's work at APNs, which a revocation
    /// waits for.
    func mayGoToAPNs(_ delivery: Delivery) -> Bool {
        let first = !delivery.ending.countedAtAPNs
        let allowed = shard(of: delivery.item).withState {
            $0.partitions.sendBegins(delivery.item.partition, generation: delivery.item.generation, first: first)
        }
        if allowed { delivery.ending.countedAtAPNs = true }
        return allowed
    }

    /// The delivery no longer counts among its partition's work at APNs; the revocation's waiter
    /// goes on when that settled the last shard it waited for.
    func leftAPNs(_ delivery: Delivery) {
        guard delivery.ending.countedAtAPNs else { return }
        delivery.ending.countedAtAPNs = false
        let box = shard(of: delivery.item)
        let waiter = box.withState { shard -> DispatchSemaphore? in
            guard Self.endAtAPNs(delivery.item, &shard) else { return nil }
            return revocation.settled(box.index)
        }
        waiter?.signal()
    }

    // An outcome on its way to Kafka by callbacks, named by an integer its delivery report
    // carries: its item's shard and a slot of that shard's table.

    /// Keeps the item in its shard's table until its outcome's delivery report comes; returns
    /// the slot the report names (the table's slot, times the shard count, plus the shard).
    /// On the item's shard's loop only (``ShardBox/concluding``).
    func outcomeSlot(_ concluding: Concluding) -> Int {
        let box = shard(of: concluding.item)
        return box.concluding.value.insert(concluding) * shards.count + box.index
    }

    /// Frees a slot whose outcome was never handed to the producer (its record failed, or the
    /// relay abandoned it), so that no report is awaited for it. On its shard's loop only (a
    /// record's failure goes on in a turn of that loop of its own).
    func freeOutcomeSlot(_ slot: Int) {
        _ = shards[slot % shards.count].concluding.value.remove(slot / shards.count)
    }

    /// The items the reports name, each taken from its shard's table, with their reports'
    /// results, in the reports' order. On the reports' shard's loop: a chunk handed to a loop
    /// (``outcomesDelivered(_:)``) is all one shard's.
    func concluding(_ reports: ArraySlice<DeliveryReportBatcher.Report>) -> [(Concluding, Result<KafkaProducer.Delivery, KafkaError>)] {
        var taken: [(Concluding, Result<KafkaProducer.Delivery, KafkaError>)] = []
        taken.reserveCapacity(reports.count)
        var empty: [Int] = []
        guard let first = reports.first else { return taken }
        let box = shards[first.slot % shards.count]
        box.concluding.withValue { table in
            for (slot, result) in reports {
                precondition(slot % shards.count == box.index, "a chunk of delivery reports is one shard's")
                guard let concluding = table.remove(slot / shards.count) else {
                    empty.append(slot)
                    continue
                }
                taken.append((concluding, result))
            }
        }
        if !empty.isEmpty {
            // Every slot handed to the producer is reported once: a report for an empty slot is
            // a bug, and an item whose report went elsewhere never ends (its offset never stored).
            logger.error("delivery reports named slots that hold no outcome", metadata: ["kafka.slots": "\(empty.prefix(10))"])
            assertionFailure("delivery reports for empty slots \(empty)")
        }
        return taken
    }
}
