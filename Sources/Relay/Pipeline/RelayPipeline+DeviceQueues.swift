import Kafka
import NIOCore

extension RelayPipeline {
    /// Starts the message's offset and puts its item in its device's queue; returns the item
    /// when it can start now (nil when it waits behind its device's earlier ones, or its
    /// partition is not ours). `consumedAt`: when the consumer handed the message over.
    func admit(_ message: KafkaMessage, _ parsed: Result<Intent, InvalidIntent>, _ admission: Admission,
               lane: Int = 0, generation expected: Int? = nil, policy: (start: UInt64, end: UInt64)? = nil,
               consumedAt: ContinuousClock.Instant = .now, readMarks: [UInt64]? = nil, policyDecision: String? = nil,
               forgetsUnregistered: Bool = true) -> WorkItem? {
        let partition = message.topicPartition
        let trace = Self.traceContext(message)
        let traced = Self.intentTrace(trace, tracer: tracer, policy: policy, id: try? parsed.get().id)
        var hold = false, ours = true
        // The shard that handed out the generation its batch read, or (asked without one) the
        // partition's now. None for a record read while its partition was not ours (generation
        // -1): it is no shard's, and its work group may run on any shard's loop.
        let box: ShardBox? = switch expected {
        case .none: shard(of: partition)
        case .some(let generation) where generation < 0: nil
        case .some(let generation): shards[Self.shardIndex(ofGeneration: generation, shards: shards.count)]
        }
        let readMark = box.flatMap { box in readMarks.map { $0[box.index] } }
        let admitted = box.map { box in box.withState { shard -> (WorkItem?, Int) in
            guard let generation = shard.partitions.start(partition, offset: message.offset, generation: expected) else {
                ours = false
                return (nil, state.withLock { $0.lanes.inFlight[lane] })
            }
            hold = shard.partitions.holdIfFull(partition)
            if hold { box.publish(shard) }
            guard case .success(let intent) = parsed else {
                let item = WorkItem(partition: partition, lane: lane, offset: message.offset, generation: generation,
                                    consumedAt: consumedAt, intent: parsed, trace: trace, traced: traced)
                return state.withLock { state in
                    Self.admitted(lane, consumedAt: consumedAt, &state)
                    return (item, state.lanes.inFlight[lane])
                }
            }
            var admission = admission
            var recordsAnswer = false
            // A park this batch's read could not see: decided again in its turn, from a read
            // that does (``DeviceQueues/missedPark(_:since:)``).
            if case .send = admission, let readMark, shard.queues.missedPark(intent, since: readMark), isEnforced(intent) {
                admission = .readmit
            }
            if deduplicator != nil, Self.mayRecordAnswer(admission) {
                let key = AnswerKey(intent)
                if shard.queues.answering[key] != nil {
                    // A copy in flight here is in its device's queue (Redis learns of it only
                    // once APNs answered it). In shadow mode it is sent all the same, as with the
                    // policy off; the first copy records the answer.
                    if isEnforced(intent) { admission = .duplicate(nil) }
                } else {
                    // A copy answered after this batch read Redis: the read could not see its
                    // record. Decided again in its turn, from a read that does (enforce mode).
                    if case .send = admission, let readMark, shard.queues.recentAnswers.answered(.answered(key), since: readMark),
                       isEnforced(intent) {
                        admission = .readmit
                    }
                    // Decided again or not, it answers for its copies consumed meanwhile.
                    recordsAnswer = true
                }
            }
            // One recipient that cannot drain keeps no more than its share of the waiting room.
            if Self.countsAgainstBacklog(admission),
               let queued = shard.queues.devices[intent.recipient]?.count, queued > configuration.limits.maxWaitingPerRecipient {
                admission = .recipientBacklog
                recordsAnswer = false
            }
            let item = WorkItem(partition: partition, lane: lane, offset: message.offset, generation: generation,
                                consumedAt: consumedAt, intent: parsed, admission: admission, recordsAnswer: recordsAnswer,
                                trace: trace, traced: traced, policyDecision: policyDecision, forgetsUnregistered: forgetsUnregistered)
            return state.withLock { state in
                Self.admitted(lane, consumedAt: consumedAt, &state)
                return (Self.enqueue(item, &shard, &state), state.lanes.inFlight[lane])
            }
        } }
        if admitted == nil { ours = false }
        let (start, inFlight) = admitted ?? (nil, state.withLock { $0.lanes.inFlight[lane] })
        // Not ours (revoked meanwhile): no work, so its span ends now.
        if !ours { traced?.end(without: "unfinished") }
        laneMetrics[lane].consumed.increment()
        laneMetrics[lane].inFlight.record(inFlight)
        if hold { held(partition) }
        return start
    }

    /// An intent of `lane` was admitted: it counts among the lane's intents in flight.
    static func admitted(_ lane: Int, consumedAt: ContinuousClock.Instant, _ state: inout State) {
        if state.firstConsumedAt == nil { state.firstConsumedAt = consumedAt }
        state.lanes.admitted(lane)
    }

    /// The item's slot is free: it no longer counts among the intents in flight of its lane, nor
    /// (``WorkItem/holdsAnswer``) among the copies in flight that answer for the copies admitted
    /// after it. Both in one step: a copy admitted into the freed slot while the item still
    /// counted as in flight would be answered `duplicate` of it although it is done (had it
    /// ended without an answer, `expired` after a 503, the copy would never be sent).
    /// (In a step of the item's shard, on its loop, where an admission of the copy runs too.)
    static func freeSlot(of item: WorkItem, _ shard: inout Shard, _ state: inout State) {
        state.lanes.finished(item.lane)
        shard.queues.answerFreed(by: item)
    }

    /// A `coalesced` record was written for `intent` by an item that does not answer for it in
    /// ``DeviceQueues/answering``: a copy whose batch read Redis before the record is decided again in
    /// its turn (``RecentAnswers``), as for an answer from APNs. Marked in `shard`, where the
    /// intent's copies queue.
    func recordedCoalesced(_ intent: Intent, in shard: ShardBox) async {
        await shard.onLoop { $0.queues.recentAnswers.answered(.answered(AnswerKey(intent))) }
    }

    /// Notes a park of `intent` (after a 429: `tooManyRequests`) for the reads under way
    /// (``DeviceQueues/missedPark(_:since:)``).
    static func noteParked(_ intent: Intent, tooManyRequests: Bool, _ shard: inout Shard) {
        shard.queues.noteParked(intent, tooManyRequests: tooManyRequests)
    }

    /// Whether the policy of the intent's topic is enforced (not in shadow mode).
    func isEnforced(_ intent: Intent) -> Bool {
        configuration.policy.rules(for: intent.topic).mode == .enforce
    }

    /// Admissions whose item may send, and so answers for the copies consumed while it is
    /// queued: a send, and one decided again in its turn.
    static func mayRecordAnswer(_ admission: Admission) -> Bool {
        switch admission {
        case .send, .readmit: true
        default: false
        }
    }

    /// Admissions that wait in their recipient's queue for work of their own (a send, a park),
    /// and so count against `limits.max_waiting_per_recipient`; answers from what APNs said
    /// before (a duplicate, a known 410) take no such work and are let in.
    static func countsAgainstBacklog(_ admission: Admission) -> Bool {
        switch admission {
        case .send, .park, .readmit: true
        default: false
        }
    }

    /// Queues an item behind its device's earlier ones (``DeviceQueues/enqueue(_:)``); returns
    /// it when it can start now, else counts it as waiting in its lane.
    static func enqueue(_ item: WorkItem, _ shard: inout Shard, _ state: inout State) -> WorkItem? {
        let start = shard.queues.enqueue(item)
        if start == nil { state.lanes.queued(item.lane) }
        return start
    }

    /// Runs one item, then the items queued behind it for the same device, in order.
    ///
    /// When an item parks (its retries ran past the deadline, or APNs answered 429), the
    /// intents to send queued behind it for the same device and app park too, due no earlier:
    /// sent now, they would overtake it (an older notification delivered after a newer one, a
    /// badge count going backwards). In the mailbox the newest displaces it (`coalesced`), as
    /// APNs itself keeps only the newest for a device it cannot reach.
    ///
    /// `parkedUntil`: per topic, when the last parked intent of the device before `first` is due
    /// (an intent driven by callbacks that parked goes on with its device's queue here).
    func work(_ first: WorkItem, parkedUntil: [String: Int64] = [:]) async {
        var next: WorkItem? = first
        // Per topic of the device, when its last parked intent is due: every later send of that
        // topic parks behind it, whatever comes between.
        var parkedUntil = parkedUntil
        while let item = next {
            if let due = await handle(item), case .success(let intent) = item.intent {
                parkedUntil[intent.topic] = max(parkedUntil[intent.topic] ?? due, due)
            }
            next = nextInQueue(after: item, parkedUntil: parkedUntil)
        }
    }

    /// Ends `item`'s turn in its device's queue and returns the item queued behind it, if any
    /// (parking behind a parked one of its app: `parkedUntil`, per topic).
    func nextInQueue(after item: WorkItem, parkedUntil: [String: Int64]) -> WorkItem? {
        guard let turn = DeviceQueues.turn(of: item) else { return nil }
        let (queued, waiters) = shard(of: item).withState { shard -> (WorkItem?, [CheckedContinuation<Void, Never>]) in
            // The relay-wide lock only when an item was queued (most devices have one intent at a
            // time): ``nextQueued(after:_:parkedUntil:_:_:)`` in two steps.
            guard let queued = shard.queues.nextQueued(after: item, turn, parkedUntil: parkedUntil) else { return (nil, []) }
            return state.withLock { state in
                state.lanes.dequeued(queued.lane)
                // One fewer waiting: room for an admitting task if that bound held it.
                return (queued, state.lanes.waitersWithRoom())
            }
        }
        for waiter in waiters { waiter.resume() }
        return queued
    }

    /// ``nextInQueue(after:parkedUntil:)`` in a step of the item's shard and inside the relay-wide lock,
    /// for the turn ``DeviceQueues/turn(of:)`` found; the caller resumes the admitting tasks the dequeued item
    /// made room for (``LaneLedger/waitersWithRoom()``).
    static func nextQueued(after item: WorkItem, _ turn: (token: String, turnedNowOrNever: Bool), parkedUntil: [String: Int64],
                           _ shard: inout Shard, _ state: inout State) -> WorkItem? {
        guard let queued = shard.queues.nextQueued(after: item, turn, parkedUntil: parkedUntil) else { return nil }
        state.lanes.dequeued(queued.lane)
        return queued
    }
}
