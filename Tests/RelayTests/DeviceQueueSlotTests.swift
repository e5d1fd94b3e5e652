import Kafka
@testable import Relay
import Testing

/// What an intent's end frees at once (``RelayPipeline/freeSlot(of:_:_:)``): its slot among the
/// intents in flight and its place among the copies in flight that answer for later copies. A
/// copy admitted into the freed slot must not find the intent still answering for it.
@Suite("Device queue slots")
struct DeviceQueueSlotTests {
    typealias Pipeline = RelayPipeline
    static let token = String(repeating: "5b", count: 32)

    static func state() -> Pipeline.State {
        Pipeline.State(lanes: LaneLedger(weights: [1], maxInFlight: 1, maxWaiting: 10))
    }

    static func shard() -> Pipeline.Shard {
        Pipeline.Shard(partitions: PartitionLedger(uncommittedLimit: 100), queues: DeviceQueues())
    }

    static func item(offset: Int64, admission: RelayPipeline.Admission = .send, recordsAnswer: Bool = true,
                     token: String = token, partition: Int32 = 0, member: String? = nil) throws -> Pipeline.WorkItem {
        let json = #"{"id":"x","token":"\#(token)","topic":"com.example.app","payload":{"aps":{"alert":"hi"}}}"#
        let intent = try Intent.parse(Array(json.utf8), key: nil, now: 1_700_000_000, defaultTTL: 86_400)
        return Pipeline.WorkItem(partition: TopicPartition(topic: "intents", partition: partition), offset: offset, generation: 1,
                                 consumedAt: .now, intent: .success(intent), admission: admission, recordsAnswer: recordsAnswer,
                                 mailboxMember: member)
    }

    @Test func anEndedIntentNoLongerAnswersForTheCopyThatTakesItsSlot() throws {
        var state = Self.state(), shard = Self.shard()
        let first = try Self.item(offset: 0)
        let key = AnswerKey(try first.intent.get())
        state.lanes.admitted(0)
        #expect(Pipeline.enqueue(first, &shard, &state) === first)
        let read = shard.queues.recentAnswers.readBegan()
        #expect(shard.queues.answering[key] == 1 && !state.lanes.hasRoom(0))
        Pipeline.freeSlot(of: first, &shard, &state)
        // The slot is free: whoever is admitted into it now finds no copy in flight, and a read
        // that began before this end knows it missed the answer.
        #expect(state.lanes.hasRoom(0))
        #expect(shard.queues.answering[key] == nil, "a copy admitted now would be answered `duplicate` of an intent that is done")
        #expect(shard.queues.recentAnswers.answered(.answered(key), since: read))
    }

    /// A read that began before a park into an intent's mailbox missed it (the intent is decided
    /// again in its turn); one that began after it did not; a park after a 429 is missed by the
    /// device's other apps too (the backoff is the device's).
    @Test func aReadBeforeAParkMissedIt() throws {
        func intent(_ topic: String, token: String = Self.token) throws -> Intent {
            let json = #"{"id":"x","token":"\#(token)","topic":"\#(topic)","payload":{"aps":{"alert":"hi"}}}"#
            return try Intent.parse(Array(json.utf8), key: nil, now: 1_700_000_000, defaultTTL: 86_400)
        }
        let app = try intent("com.example.app"), other = try intent("com.example.other")
        let elsewhere = try intent("com.example.app", token: String(repeating: "6c", count: 32))
        var shard = Self.shard()
        let before = shard.queues.recentAnswers.readBegan()
        #expect(!shard.queues.missedPark(app, since: before))
        Pipeline.noteParked(app, tooManyRequests: false, &shard)
        let after = shard.queues.recentAnswers.readBegan()
        #expect(shard.queues.missedPark(app, since: before))
        #expect(!shard.queues.missedPark(app, since: after))
        #expect(!shard.queues.missedPark(other, since: before), "a park holds back its own app's intents")
        #expect(!shard.queues.missedPark(elsewhere, since: before))
        Pipeline.noteParked(app, tooManyRequests: true, &shard)
        #expect(shard.queues.missedPark(other, since: before), "after a 429 the device is in backoff for every app")
        #expect(shard.queues.missedPark(other, since: after))
        #expect(!shard.queues.missedPark(elsewhere, since: after))
    }

    /// A device queue that empties is kept for the next device without one (its first intent
    /// allocates no queue), up to the spare queues' bound; one that grew large is let go.
    @Test func anEmptiedDeviceQueueServesTheNextDevice() throws {
        var state = Self.state(), shard = Self.shard()
        let first = try Self.item(offset: 0)
        let turn = try #require(DeviceQueues<Pipeline.WorkItem>.turn(of: first))
        #expect(Pipeline.enqueue(first, &shard, &state) === first)
        #expect(Pipeline.nextQueued(after: first, turn, parkedUntil: [:], &shard, &state) == nil)
        #expect(shard.queues.devices.isEmpty && shard.queues.spareQueues.count == 1)
        let other = String(repeating: "6c", count: 32)
        let second = try Self.item(offset: 1, token: other)
        let otherTurn = try #require(DeviceQueues<Pipeline.WorkItem>.turn(of: second))
        #expect(Pipeline.enqueue(second, &shard, &state) === second)
        #expect(shard.queues.spareQueues.isEmpty, "taken by the next device's first intent")
        #expect(shard.queues.devices[other]?.count == 1)

        // A backlog grows the queue past what is kept.
        let backlog = try (2..<40).map { try Self.item(offset: Int64($0), token: other) }
        for item in backlog { #expect(Pipeline.enqueue(item, &shard, &state) == nil) }
        var ended = second
        while let next = Pipeline.nextQueued(after: ended, otherTurn, parkedUntil: [:], &shard, &state) { ended = next }
        #expect(shard.queues.devices.isEmpty && shard.queues.spareQueues.isEmpty, "a queue of capacity \(DeviceQueues<Pipeline.WorkItem>.spareQueueCapacity)+ is not kept")

        // Many devices' queues emptied at once: no more than the bound is kept.
        let devices = try (0..<(DeviceQueues<Pipeline.WorkItem>.spareQueueLimit + 44)).map {
            try Self.item(offset: 100 + Int64($0), token: String(format: "%064x", $0))
        }
        for item in devices { #expect(Pipeline.enqueue(item, &shard, &state) === item) }
        for item in devices { #expect(Pipeline.nextQueued(after: item, try #require(DeviceQueues<Pipeline.WorkItem>.turn(of: item)), parkedUntil: [:], &shard, &state) == nil) }
        #expect(shard.queues.devices.isEmpty && shard.queues.spareQueues.count == DeviceQueues<Pipeline.WorkItem>.spareQueueLimit)
    }

    /// A copy decided again in its turn was counted as answering for later copies when it was
    /// queued: whatever it is decided (here `duplicate`, which records nothing), its end takes
    /// it off; a second holder of the same intent keeps it answering until its own end.
    @Test func aCopyDecidedAgainStopsAnsweringWhenItEnds() throws {
        var state = Self.state(), shard = Self.shard()
        let first = try Self.item(offset: 0, admission: .readmit)
        let second = try Self.item(offset: 1, admission: .readmit)
        let key = AnswerKey(try first.intent.get())
        #expect(Pipeline.enqueue(first, &shard, &state) === first)
        #expect(Pipeline.enqueue(second, &shard, &state) == nil)
        #expect(shard.queues.answering[key] == 2)
        let decided = first.admitted(as: .duplicate(nil), recordsAnswer: false)
        #expect(!decided.recordsAnswer && decided.holdsAnswer)
        state.lanes.admitted(0)
        Pipeline.freeSlot(of: decided, &shard, &state)
        #expect(shard.queues.answering[key] == 1, "the second copy still answers for later ones")
        state.lanes.admitted(0)
        Pipeline.freeSlot(of: second, &shard, &state)
        #expect(shard.queues.answering[key] == nil)
    }

    /// A device's intents consumed from two partition numbers (their producer keys intents by
    /// something else than the device token) are counted as they queue behind one another,
    /// each against the latest consumed intent queued for the device; one partition's are not,
    /// nor a mailbox delivery (whose partition is its due index's).
    /// A device's intents on partition numbers of two shards never meet in one shard's queues:
    /// the consumed batch counts them (with two shards, partitions 0 and 1), and leaves a pair of
    /// one shard (0 and 2) to the queues; unusable messages count for nothing.
    @Test func aDevicesIntentsFromTwoShardsAreCountedAtIntake() throws {
        func parsed(_ token: String) throws -> Result<Intent, InvalidIntent> { .success(try Self.item(offset: 0, token: token).intent.get()) }
        let other = String(repeating: "cd", count: 32)
        let batch = [try parsed(Self.token), try parsed(Self.token), try parsed(other), try parsed(Self.token), try parsed(other),
                     .failure(InvalidIntent(reason: "NotJSON", message: "x", token: Self.token))]
        // Each record's shard: partitions 0, 1, 0, 2, 3, 1 placed on two shards in turn.
        #expect(Pipeline.acrossShards([0, 1, 0, 0, 1, 1], batch) == 2, "partition 1 beside 0; and 3 beside 0")
        #expect(Pipeline.acrossShards([0, 0, 0, 0, 0, 1], batch) == 0, "one shard's pairs are the queues' to count")
        #expect(Pipeline.acrossShards([0, 0, 0, 0, 0, 0], batch) == 0)
        #expect(Pipeline.acrossShards([0, nil, 0, 0, 1, 1], batch) == 1, "a record of a partition not ours is dropped, not counted")
    }

    /// The relay counts them at intake: forty devices, each with two intents under two keys (so
    /// on two partitions, for many of them of two shards), consumed together by a relay of two
    /// shards. Without the count at intake nothing counts these pairs (the shards' queues see
    /// only their own).
    ///
    /// A pair is counted when both of its records come in one consumed batch, and librdkafka can
    /// hand a fetch's partitions over in more than one (on a loaded machine it does): up to five
    /// rounds of forty devices, until one was counted.
    @Test(.stopsItsRelays, .timeLimit(.minutes(3)))
    func theRelayCountsADevicesIntentsFromTwoShardsAtIntake() async throws {
        func round(_ round: Int) -> [(json: String, key: String)] {
            (0..<40).flatMap { device -> [(json: String, key: String)] in
                let token = hexToken(0x4000 + device)
                // Keys of one length differing in one byte would land on partitions of one parity
                // (the partitioner's CRC is linear): the second key is another device's number.
                return [(json: intent("x\(round)-\(device)-0", token: token), key: token),
                        (json: intent("x\(round)-\(device)-1", token: token), key: "device-\(device)")]
            }
        }
        let harness = try await RelayHarness.start(preload: round(0), shards: 2)
        _ = try await harness.outcomes(count: 80)
        for next in 1..<5 where harness.pipeline.intentsAcrossShards.load(ordering: .relaxed) == 0 {
            _ = try await harness.producer.send(topic: harness.intentsTopic, records: round(next).map { (Array($0.key.utf8), Array($0.json.utf8)) })
            _ = try await harness.outcomes(count: 80 * (next + 1))
        }
        #expect(harness.pipeline.intentsAcrossShards.load(ordering: .relaxed) > 0)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func aDevicesIntentsFromTwoPartitionsAreCounted() throws {
        var state = Self.state(), shard = Self.shard()
        #expect(Pipeline.enqueue(try Self.item(offset: 0, partition: 0), &shard, &state) != nil)
        #expect(Pipeline.enqueue(try Self.item(offset: 1, partition: 0), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 0)
        #expect(Pipeline.enqueue(try Self.item(offset: 7, partition: 3), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 1)
        #expect(Pipeline.enqueue(try Self.item(offset: 8, partition: 3), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 1, "behind its own partition's intent")
        #expect(Pipeline.enqueue(try Self.item(offset: 2, partition: 5, member: "m"), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 1, "a mailbox delivery's partition is its due index's")
        #expect(Pipeline.enqueue(try Self.item(offset: 2, partition: 0), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 2, "compared with the latest consumed intent (partition 3), past the mailbox delivery")
        #expect(Pipeline.enqueue(try Self.item(offset: 3, partition: 0), &shard, &state) == nil)
        #expect(shard.queues.acrossPartitions == 2)
        let other = String(repeating: "6c", count: 32)
        #expect(Pipeline.enqueue(try Self.item(offset: 10, token: other, partition: 3), &shard, &state) != nil)
        #expect(shard.queues.acrossPartitions == 2, "another device")
    }
}
