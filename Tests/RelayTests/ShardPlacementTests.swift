import APNs
import Common
import Foundation
import Kafka
import NIOCore
import NIOPosix
@testable import Relay
import TestSupport
import Testing

/// Where a partition number's work runs (``ShardPlacement``), the generations that name the
/// shard of an item (``PartitionLedger/shard(ofGeneration:shards:)``), and a batch's work groups.
@Suite("Shard placement")
struct ShardPlacementTests {
    static func partitions(_ numbers: [Int32], topic: String = "intents") -> [(topic: String, number: Int32)] {
        numbers.map { (topic, $0) }
    }

    /// Numbers of one residue (a relay given the even partitions of a group) spread over every
    /// shard: by their number modulo two they would all be on shard 0.
    @Test func numbersOfOneResidueSpreadOverEveryShard() {
        var placement = ShardPlacement(shards: 2)
        placement.assign(Self.partitions([6, 0, 4, 2]))
        #expect([0, 2, 4, 6].map { placement.shard(of: $0) } == [0, 1, 0, 1], "in ascending order, each on the least loaded")
        #expect(placement.load == [2, 2])
        var three = ShardPlacement(shards: 3)
        three.assign(Self.partitions([0, 3, 6, 9, 12]))
        #expect(three.load == [2, 2, 1])
    }

    /// A number stays on its shard while a partition of it, of any lane, is ours: a device's
    /// intents of both lanes meet in one shard's queues.
    @Test func aNumberStaysWhileAnyLaneOwnsIt() {
        var placement = ShardPlacement(shards: 2)
        placement.assign(Self.partitions([0, 1], topic: "urgent") + Self.partitions([0, 1], topic: "bulk"))
        #expect(placement.load == [1, 1])
        placement.revoke(Self.partitions([1], topic: "urgent"))
        placement.assign(Self.partitions([2], topic: "urgent"))
        #expect(placement.shard(of: 1) == 1, "bulk's partition 1 is still ours")
        #expect(placement.shard(of: 2) == 0)
        placement.revoke(Self.partitions([1], topic: "bulk"))
        #expect(!placement.isPlaced(1))
        #expect(placement.load == [2, 0])
        // The next number goes where there is room (not where its number modulo two would).
        placement.assign(Self.partitions([4], topic: "bulk"))
        #expect(placement.shard(of: 4) == 1)
        #expect(placement.load == [2, 1])
    }

    /// A revoked number is placed anew at its next assignment; the same partition assigned twice
    /// counts once; a number not ours names a shard all the same (nothing of it is owned there).
    @Test func aFreedNumberIsPlacedAnew() {
        var placement = ShardPlacement(shards: 2)
        placement.assign(Self.partitions([0, 1, 2, 3]))
        #expect(placement.shard(of: 2) == 0)
        placement.revoke(Self.partitions([2, 3]))
        #expect(placement.load == [1, 1])
        placement.assign(Self.partitions([5]))
        placement.assign(Self.partitions([2, 2]))
        #expect(placement.shard(of: 2) == 1, "on the least loaded shard now, not its earlier one")
        #expect(placement.load == [2, 2])
        placement.revoke(Self.partitions([2]))
        #expect(!placement.isPlaced(2), "assigned twice, revoked once: the partition is not ours")
        #expect(placement.shard(of: 7) == 1)
        #expect(placement.shard(of: -3) == 1)
        #expect(ShardPlacement(shards: 0).shard(of: 5) == 0)
    }

    /// Each shard's ledger hands out generations of its own: a generation names its shard, and
    /// an item of a partition that moved never passes as the new shard's.
    @Test func aGenerationNamesItsShard() throws {
        let partition = TopicPartition(topic: "intents", partition: 3)
        var first = PartitionLedger<TopicPartition>(shard: 0, of: 2)
        var second = PartitionLedger<TopicPartition>(shard: 1, of: 2)
        first.assign([partition])
        let old = try #require(first.generation(of: partition))
        first.revoke([partition])
        second.assign([partition])
        let new = try #require(second.generation(of: partition))
        #expect(PartitionLedger<TopicPartition>.shard(ofGeneration: old, shards: 2) == 0)
        #expect(PartitionLedger<TopicPartition>.shard(ofGeneration: new, shards: 2) == 1)
        #expect(old != new)
        #expect(!second.owns(partition, generation: old))
        first.assign([partition])
        #expect(first.generation(of: partition) != old, "back on its first shard, a new generation")
        #expect(PartitionLedger<TopicPartition>.shard(ofGeneration: -1, shards: 2) == 1)
        var alone = PartitionLedger<TopicPartition>()
        alone.assign([partition])
        #expect(alone.generation(of: partition) == 1, "one ledger alone counts from 1")
    }

    /// A batch's work groups: each shard's records in their order, at most `workGroupSize` a
    /// group, the shards' groups in turn from the batch's first shard; a record not ours goes
    /// with shard 0's.
    @Test func aBatchIsGroupedByShardInTurn() {
        let size = RelayPipeline.workGroupSize
        let shards: [Int?] = (0..<(size * 2 + 10)).map { $0 < size + 5 ? 1 : ($0 == size + 5 ? nil : 0) }
        let groups = RelayPipeline.workGroups(shards, shards: 2)
        #expect(groups.map(\.shard) == [0, 1, 0, 1])
        #expect(groups.map(\.indices.count) == [size, size, 5, 5])
        #expect(Array(groups[1].indices) == Array(0..<size))
        #expect(groups[0].indices.first == size + 5, "the record not ours, first of shard 0's")
        let second = RelayPipeline.workGroups(shards, shards: 2, first: 1)
        #expect(second.map(\.shard) == [1, 0, 1, 0], "the next batch's shard 1 goes first")
        #expect(second.map(\.indices) == [groups[1], groups[0], groups[3], groups[2]].map(\.indices))
        #expect(RelayPipeline.workGroups([], shards: 2).isEmpty)
        #expect(RelayPipeline.workGroups([nil, nil], shards: 1).map(\.indices.count) == [2])
    }

    /// librdkafka revokes on its poll thread, where a partition's assignment can still wait
    /// behind consumed batches for the reader: its number is not placed yet when the revocation
    /// marks it, and is placed after. The mark reaches the shard the assignment then goes to,
    /// and the revocation clears it wherever it went: the partition's next assignment, on any
    /// shard, starts its records. (Marked on its number's shard by modulo alone, the records read
    /// before the revocation would have started on the other, and a later assignment on the
    /// marked shard would have started none.)
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)))
    func aRevocationBeforeItsAssignmentReachedTheReaderStopsItsWork() async throws {
        let harness = try await RelayHarness.start(shards: 2)
        let pipeline = harness.pipeline
        try await waitUntil(timeout: .seconds(30)) { pipeline.owned.count == 4 }
        // Partitions of a topic of the test's own, beside the relay's four.
        func partition(_ number: Int32) -> TopicPartition { TopicPartition(topic: "placed-\(UUID().uuidString.prefix(4))", partition: number) }
        let (ten, eleven, twelve) = (partition(10), partition(11), partition(12))
        await pipeline.assign([ten, eleven])
        await pipeline.revoke([eleven])
        let target = pipeline.placement.withLock { placement in
            var next = placement
            next.assign([(twelve.topic, twelve.partition)])
            return next.shard(of: twelve.partition)
        }
        try #require(target != 12 % 2, "the test needs twelve placed off its number's shard")
        pipeline.partitionsRevoking([twelve], lost: false)
        await pipeline.assign([twelve])
        #expect(pipeline.shard(of: twelve).index == target)
        let generation = try #require(await pipeline.shard(of: twelve).onLoop { $0.partitions.generation(of: twelve) })
        #expect(await pipeline.shard(of: twelve).onLoop { $0.partitions.start(twelve, offset: 0, generation: generation) } == nil,
                "a record read before the revocation does not start")
        await pipeline.revoke([twelve])
        for shard in pipeline.shards {
            #expect(await shard.onLoop { !$0.partitions.revoking.contains(twelve) }, "shard \(shard.index)")
            #expect(!shard.publishedPartitions.revoking.contains(twelve), "shard \(shard.index), as published")
        }
        // Assigned again: on the shard it was placed on, then (ten revoked, the shards even) on
        // the other.
        var placedOn: Set<Int> = []
        for _ in 0..<2 {
            await pipeline.assign([twelve])
            let box = pipeline.shard(of: twelve)
            placedOn.insert(box.index)
            let next = try #require(await box.onLoop { $0.partitions.generation(of: twelve) })
            #expect(box.publishedPartitions.generations[twelve] == next, "published as assigned")
            #expect(await box.onLoop { $0.partitions.start(twelve, offset: 1, generation: next) } == next, "shard \(box.index)")
            await pipeline.revoke([twelve, ten])
        }
        #expect(placedOn == [0, 1])
        await harness.stop()
    }

    /// Two relays of a group under librdkafka's `roundrobin` assignor, which hands four
    /// partitions out in turn: each relay owns numbers of one residue, and each of its two shards
    /// gets one of them. By number modulo two, every partition of a relay would be on one shard,
    /// and it would send from one of its two event loops.
    @Test(.stopsItsRelays, .timeLimit(.minutes(3)))
    func twoRelaysGivenPartitionsInTurnUseBothOfTheirShards() async throws {
        let harness = try await RelayHarness.start(configureRelay: { $0.kafka.consumerProperties["partition.assignment.strategy"] = "roundrobin" },
                                                   shards: 2)
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.owned.count == 4 }
        let second = try RelayApplication(configuration: harness.configuration, worker: "second", shards: 2)
        let running = Task { await second.run() }
        let relays = [harness.pipeline, second.pipeline]
        try await waitUntil(timeout: .seconds(60)) { relays.allSatisfy { $0.owned.count == 2 } }
        for relay in relays {
            let numbers = relay.owned.map(\.partition)
            try #require(Set(numbers.map { $0 % 2 }).count == 1, "roundrobin hands partitions out in turn: \(numbers)")
            #expect(Set(relay.owned.map { relay.shard(of: $0).index }) == [0, 1], "\(numbers)")
            #expect(relay.placement.withLock { $0.load } == [1, 1])
            for shard in relay.shards { #expect(await shard.onLoop { $0.partitions.owned.count } == 1, "shard \(shard.index)") }
        }
        let count = 200
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            let token = hexToken(0x3000 + $0)
            return (Array(token.utf8), Array(intent("p-\($0)", token: token).utf8))
        })
        try await waitUntil(timeout: .seconds(60)) { Set(harness.simulator.accepted.map(\.apnsID)).count >= count }
        #expect(second.pipeline.outcomeCounts.values.reduce(0, +) > 0 && harness.pipeline.outcomeCounts.values.reduce(0, +) > 0)
        second.requestStop()
        await running.value
        await harness.stop()
    }

    /// A delivered outcome's report ends on its shard's event loop, not on the producer's poll
    /// thread: seen where the outcome is counted, in the same turn as its item's offset store
    /// and its device's next intent's start.
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)))
    func deliveryReportsEndOnTheirShardsLoop() async throws {
        let ends = Locked<[(partition: Int32, loop: ObjectIdentifier?)]>([])
        let harness = try await RelayHarness.start(shards: 2, published: { outcome in
            let loop = MultiThreadedEventLoopGroup.currentEventLoop.map { ObjectIdentifier($0) }
            ends.withLock { $0.append((outcome.partition, loop)) }
        })
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.owned.count == 4 }
        // Two intents per device: the second waits behind the first and starts where its report ends.
        let count = 100
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            let token = hexToken(0x4000 + $0 / 2)
            return (Array(token.utf8), Array(intent("r-\($0)", token: token).utf8))
        })
        try await waitUntil(timeout: .seconds(60)) { ends.withLock { $0.count } >= count }
        #expect(harness.pipeline.intentsDrivenByCallbacks >= count)
        for (partition, loop) in ends.withLock({ $0 }) {
            let shard = harness.pipeline.shard(of: TopicPartition(topic: harness.intentsTopic, partition: partition))
            #expect(loop == ObjectIdentifier(harness.pipeline.shardLoop(shard.index)), "partition \(partition) ended off its shard's loop")
        }
        await harness.stop()
    }

    /// With one APNs connection, on one of the two loops, the other shard's answers come on a
    /// loop that is not theirs: each goes on on its shard's loop (the answer handed over there),
    /// where its shard's state and its outcome's slot (``RelayPipeline/ShardBox/concluding``) are
    /// confined, and every outcome still ends. (On one core both shards share its loop and no
    /// answer comes on another's: the test needs two cores.)
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)), .enabled(if: System.coreCount > 1, "two shards on one loop hand nothing over"))
    func answersOnAnotherLoopsConnectionGoOnOnTheirShardsLoop() async throws {
        let harness = try await RelayHarness.start(configureRelay: { $0.apns.connections = 1 }, shards: 2, countsShardTurns: true)
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.owned.count == 4 }
        try #require(harness.pipeline.shards[0].loop !== harness.pipeline.shards[1].loop)
        let before = harness.pipeline.shardTurns
        let count = 200
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            let token = hexToken(0x5000 + $0 / 2)
            return (Array(token.utf8), Array(intent("o-\($0)", token: token).utf8))
        })
        _ = try await harness.outcomes(count: count)
        let after = harness.pipeline.shardTurns
        #expect(harness.pipeline.intentsDrivenByCallbacks >= count)
        #expect(harness.simulator.connectionsAccepted == 1)
        // Half of the answers come on the other shard's loop: judged there, they would stop the
        // relay at the state's precondition (every outcome came: none was). The hops counted
        // are the awaited hand-overs (`onLoop`), here the lag report's once a second; an
        // answer's `execute` to its loop is not among them.
        #expect(after.all - before.all >= count, "every intent's steps use its shard's state")
        #expect(after.hops - before.hops < count / 8, "\(after.hops - before.hops) hops for \(count) intents")
        await harness.stop()
    }

    /// A record read while its partition was not ours (its generation -1: revoked between the
    /// poll and the read) is no shard's: its work group runs on shard 0's loop, and its
    /// admission touches no shard's state there. (Sent to the shard that generation -1 names by
    /// modulo, the last, it stopped the relay at that shard's precondition.) The test needs two
    /// loops: on one core every shard shares it.
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)), .enabled(if: System.coreCount > 1, "two shards on one loop share it"))
    func aRecordReadWhileItsPartitionWasNotOursIsNoShards() async throws {
        let harness = try await RelayHarness.start(shards: 2)
        let pipeline = harness.pipeline
        try await waitUntil(timeout: .seconds(30)) { pipeline.owned.count == 4 }
        try #require(pipeline.shards[0].loop !== pipeline.shards[1].loop)
        let token = hexToken(0x7000)
        let message = KafkaMessage(topic: harness.intentsTopic, partition: 0, offset: 1_000_000, key: Array(token.utf8),
                                   value: Array(intent("not-ours", token: token).utf8), timestamp: nil)
        let parsed = pipeline.parse(message, now: 0)
        let started = await Task(executorPreference: pipeline.shardExecutor(0)) {
            pipeline.admit(message, parsed, .send, generation: -1) != nil
        }.value
        #expect(!started, "not ours: nothing starts")
        #expect(pipeline.inFlight == 0)
        await harness.stop()
    }

    /// A turn that leaves the callbacks runs in a task on its item's shard's event loop, as the
    /// task per intent does: here the intent queued behind a device's first, which does not
    /// qualify for callbacks (a badge), is started by its report's end and worked in such a
    /// task, down to its outcome (a badge needs Redis: `failed`).
    @Test(.stopsItsRelays, .timeLimit(.minutes(2)))
    func aTurnInATaskRunsOnItsShardsLoop() async throws {
        let ends = Locked<[String: (partition: Int32, loop: ObjectIdentifier?)]>([:])
        let harness = try await RelayHarness.start(shards: 2, published: { outcome in
            let loop = MultiThreadedEventLoopGroup.currentEventLoop.map { ObjectIdentifier($0) }
            ends.withLock { $0[outcome.id ?? ""] = (outcome.partition, loop) }
        })
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.owned.count == 4 }
        let devices = 20
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<devices).flatMap { device in
            let token = hexToken(0x6000 + device)
            return [(Array(token.utf8), Array(intent("plain-\(device)", token: token).utf8)),
                    (Array(token.utf8), Array(intent("badge-\(device)", token: token, extra: #","badge":{"increment":1}"#).utf8))]
        })
        try await waitUntil(timeout: .seconds(60)) { ends.withLock { $0.count } >= 2 * devices }
        let badges = ends.withLock { $0.filter { $0.key.hasPrefix("badge-") } }
        #expect(badges.count == devices)
        for (id, end) in badges {
            let shard = harness.pipeline.shard(of: TopicPartition(topic: harness.intentsTopic, partition: end.partition))
            #expect(end.loop == ObjectIdentifier(shard.loop), "\(id) was worked off its shard's loop")
        }
        #expect(harness.pipeline.callbackTurnsInTasks >= devices)
        await harness.stop()
    }

    /// A shard counts its state's turns, and the hops to its loop they took, when asked to (the
    /// benchmark's `shard_turns_per_intent`), and nothing otherwise; on its loop a turn runs in
    /// place, off it ``RelayPipeline/ShardBox/onLoop(_:)`` and
    /// ``RelayPipeline/ShardBox/onLoopWaiting(atMost:_:)`` run it there.
    @Test func aShardCountsItsTurnsAndHops() async throws {
        let counting = Self.shard(counts: true), silent = Self.shard(counts: false)
        for box in [counting, silent] {
            #expect(await box.onLoop { _ in box.loop.inEventLoop })
            let ranThere = Locked(false)
            let waited = await Task.detached {
                box.onLoopWaiting(atMost: .seconds(30)) { _ in ranThere.withLock { $0 = box.loop.inEventLoop } }
            }.value
            #expect(waited && ranThere.withLock { $0 })
            try await box.loop.submit { box.withState { _ in }; _ = box.onLoopWaiting(atMost: .seconds(1)) { _ in } }.get()
        }
        #expect(counting.stateTurns == (4, 2), "four turns, two of them hops")
        #expect(silent.stateTurns == (0, 0))
    }

    /// The consumer's poll thread waits for a shard's step (a revocation's marks) for a bounded
    /// time: a loop that stopped turning does not hold it (and librdkafka's rebalance) for good.
    /// The step runs once the loop turns again.
    @Test func aWaitForAStuckLoopEndsAtItsLimit() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let box = RelayPipeline.ShardBox(index: 0, executor: EventLoopTaskExecutor(eventLoop: loop),
                                         RelayPipeline.Shard(partitions: PartitionLedger(uncommittedLimit: 10, shard: 0, of: 1),
                                                             queues: DeviceQueues(precedence: [0])))
        let release = DispatchSemaphore(value: 0), stuck = DispatchSemaphore(value: 0)
        loop.execute {
            stuck.signal()
            release.wait()
        }
        stuck.wait()
        let ran = Locked(false)
        let waited = await Task.detached {
            box.onLoopWaiting(atMost: .milliseconds(200)) { _ in ran.withLock { $0 = true } }
        }.value
        #expect(!waited, "the loop is stuck: the wait ends at its limit")
        #expect(!ran.withLock { $0 })
        release.signal()
        try await loop.submit {}.get()
        #expect(ran.withLock { $0 }, "the step ran once the loop turned again")
        try await group.shutdownGracefully()
    }

    /// A shard's state is confined to its loop: a turn taken anywhere else stops the process,
    /// in release builds too, instead of racing with the loop.
    @Test func aTurnOffItsShardsLoopStops() async {
        await #expect(processExitsWith: .failure) {
            ShardPlacementTests.shard(counts: false).withState { _ in }
        }
    }

    static func shard(counts: Bool) -> RelayPipeline.ShardBox {
        RelayPipeline.ShardBox(index: 0, executor: EventLoopTaskExecutor(eventLoop: MultiThreadedEventLoopGroup.singleton.next()),
                               countsTurns: counts,
                               RelayPipeline.Shard(partitions: PartitionLedger(uncommittedLimit: 10, shard: 0, of: 1),
                                                   queues: DeviceQueues(precedence: [0])))
    }
}
