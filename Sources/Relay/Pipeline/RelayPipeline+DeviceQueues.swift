import Kafka
import NIOCore

extension RelayPipeline {
    /// Starts the message's offset and puts its item in its device's queue; returns the item
    /// when it can start now (nil when it waits behind its device's earlier ones, or its
    /// partition is not ours). `consumedAt`: when the consumer handed the message over.
    func admit(_ message: KafkaMessage, _ parsed: Result<Intent, InvalidIntent>, _ admission: Admission,
               lane: Int = 0, generation expected: Int? = nil, policy: (start: UInt64, end: UInt64)? = nil,
               consumedAt: ContinuousClock.Instant = .now, readMark: UInt64? = nil, policyDecision: String? = nil,
               forgetsUnregistered: Bool = true) -> WorkItem? {
        let partition = message.topicPartition
        let trace = Self.traceContext(message)
        let traced = Self.intentTrace(trace, tracer: tracer, policy: policy, id: try? parsed.get().id)
        var hold = false, ours = true
        let (start, inFlight) = state.withLock { state -> (WorkItem?, Int) in
            guard let generation = state.partitions.start(partition, offset: message.offset, generation: expected) else {
                ours = false
                return (nil, state.lanes.inFlight[lane])
            }
            hold = state.partitions.holdIfFull(partition)
            if state.firstConsumedAt == nil { state.firstConsumedAt = consumedAt }
            state.lanes.admitted(lane)
            guard case .success(let intent) = parsed else {
                return (WorkItem(partition: partition, lane: lane, offset: message.offset, generation: generation,
                                 consumedAt: consumedAt, intent: parsed, trace: trace, traced: traced), state.lanes.inFlight[lane])
            }
            var admission = admission
            var recordsAnswer = false
            // A park this batch's read could not see: decided again in its turn, from a read
            // that does (``missedPark(_:since:_:)``).
            if case .send = admission, let readMark, Self.missedPark(intent, since: readMark, state), isEnforced(intent) {
                admission = .readmit
            }
            if deduplicator != nil, Self.mayRecordAnswer(admission) {
                let key = AnswerKey(intent)
                if state.answering[key] != nil {
                    // A copy in flight here is in its device's queue (Redis learns of it only
                    // once APNs answered it). In shadow mode it is sent all the same, as with the
                    // policy off; the first copy records the answer.
                    if isEnforced(intent) { admission = .duplicate(nil) }
                } else {
                    // A copy answered after this batch read Redis: the read could not see its
                    // record. Decided again in its turn, from a read that does (enforce mode).
                    if case .send = admission, let readMark, state.recentAnswers.answered(.answered(key), since: readMark),
                       isEnforced(intent) {
                        admission = .readmit
                    }
                    // Decided again or not, it answers for its copies consumed meanwhile.
                    recordsAnswer = true
                }
            }
            // One recipient that cannot drain keeps no more than its share of the waiting room.
            if Self.countsAgainstBacklog(admission),
               let queued = state.devices[intent.recipient]?.count, queued > configuration.limits.maxWaitingPerRecipient {
                admission = .recipientBacklog
                recordsAnswer = false
            }
            let item = WorkItem(partition: partition, lane: lane, offset: message.offset, generation: generation,
                                consumedAt: consumedAt, intent: parsed, admission: admission, recordsAnswer: recordsAnswer,
                                trace: trace, traced: traced, policyDecision: policyDecision, forgetsUnregistered: forgetsUnregistered)
            return (Self.enqueue(item, &state, precedence: lanePrecedence), state.lanes.inFlight[lane])
        }
        // Not ours (revoked meanwhile): no work, so its span ends now.
        if !ours { traced?.end(without: "unfinished") }
        laneMetrics[lane].consumed.increment()
        laneMetrics[lane].inFlight.record(inFlight)
        if hold { held(partition) }
        return start
    }

    /// The item's slot is free: it no longer counts among the intents in flight of its lane, nor
    /// (``WorkItem/holdsAnswer``) among the copies in flight that answer for the copies admitted
    /// after it. Both in one step: a copy admitted into the freed slot while the item still
    /// counted as in flight would be answered `duplicate` of it although it is done (had it
    /// ended without an answer, `expired` after a 503, the copy would never be sent).
    static func freeSlot(of item: WorkItem, _ state: inout State) {
        state.lanes.finished(item.lane)
        guard item.holdsAnswer, case .success(let intent) = item.intent else { return }
        let key = AnswerKey(intent)
        if let count = state.answering[key], count > 1 {
            state.answering[key] = count - 1
        } else {
            state.answering[key] = nil
            state.recentAnswers.answered(.answered(key))
        }
    }

    /// A `coalesced` record was written for `intent` by an item that does not answer for it in
    /// ``State/answering``: a copy whose batch read Redis before the record is decided again in
    /// its turn (``RecentAnswers``), as for an answer from APNs.
    func recordedCoalesced(_ intent: Intent) {
        state.withLock { $0.recentAnswers.answered(.answered(AnswerKey(intent))) }
    }

    /// What a batch's admission read of Redis may have missed (``State/recentAnswers``).
    enum RecentChange: Hashable {
        /// APNs' answer to the intent was recorded (a copy of it is a duplicate).
        case answered(AnswerKey)
        /// An intent was parked in this device (or channel) and app's mailbox (the others
        /// wait behind it).
        case parked(recipient: String, topic: String)
        /// An intent of this device was parked after a 429: the device is in backoff, for
        /// every app.
        case backedOff(recipient: String)
    }

    /// Whether the read marked `readMark` missed a park into the intent's device and app's
    /// mailbox, or a 429 backoff of its device: sent now, the intent would overtake the parked
    /// one, or go out inside the backoff. Looked up only when a park came after the read
    /// (``State/lastParkMark``): parks are rare, sends are not.
    static func missedPark(_ intent: Intent, since readMark: UInt64, _ state: State) -> Bool {
        guard state.lastParkMark > readMark else { return false }
        return state.recentAnswers.answered(.parked(recipient: intent.recipient, topic: intent.topic), since: readMark)
            || state.recentAnswers.answered(.backedOff(recipient: intent.recipient), since: readMark)
    }

    /// Notes a park of `intent` (after a 429: `tooManyRequests`) for the reads under way
    /// (``missedPark(_:since:_:)``).
    static func noteParked(_ intent: Intent, tooManyRequests: Bool, _ state: inout State) {
        state.recentAnswers.answered(.parked(recipient: intent.recipient, topic: intent.topic))
        if tooManyRequests { state.recentAnswers.answered(.backedOff(recipient: intent.recipient)) }
        state.lastParkMark = state.recentAnswers.latestMark
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

    /// An intent whose answer an item in its recipient's queue records (``WorkItem/recordsAnswer``):
    /// a copy consumed meanwhile is answered `duplicate` of it, looked up without scanning the
    /// queue.
    struct AnswerKey: Hashable {
        var recipient: String
        var topic: String
        var id: String

        init(_ intent: Intent) {
            recipient = intent.recipient
            topic = intent.topic
            id = intent.id
        }
    }

    /// `queued`, an intent consumed to be sent behind an intent of its device and app that
    /// parked until `due`, as one to park at `due` (or, now-or-never, to end `expired`: it
    /// cannot wait); nil when it is not such an intent.
    static func parkingBehind(_ queued: WorkItem, due: Int64) -> WorkItem? {
        guard case .send = queued.admission, queued.mailboxMember == nil,
              case .success(let later) = queued.intent else { return nil }
        return queued.admitted(as: later.expiration == 0 ? .nowOrNever : .park(due: due))
    }

    /// Queues an item behind its device's earlier ones; returns it when it can start now.
    ///
    /// With lanes (`precedence`: each lane's precedence, ``RelayPipeline/lanePrecedence``), an
    /// intent to send waits behind its device's items of its own lane and of higher precedence
    /// only: it goes ahead of those of lower precedence that are sends not started (the queue's
    /// first item runs). So an urgent intent does not wait for every bulk intent queued for its
    /// device, and each lane's intents keep their order. It never goes ahead of an intent to
    /// park (that one would park after it and displace it from the mailbox, newer as it is) or
    /// of a mailbox delivery, and other admissions (a duplicate, a known 410) stay behind the
    /// intent they answer for. Inserting copies the queue's storage: only overtaking pays it.
    static func enqueue(_ item: WorkItem, _ state: inout State, precedence: [Int] = []) -> WorkItem? {
        guard let token = item.queueToken else { return item }
        if item.holdsAnswer, case .success(let intent) = item.intent { state.answering[AnswerKey(intent), default: 0] += 1 }
        // The token is hashed once (a device's queue is looked up by it several times per intent).
        if let index = state.devices.index(forKey: token) {
            // No copy of the queue is held while it changes (that would copy its storage).
            if precedence.count > 1, case .send = item.admission, item.mailboxMember == nil,
               let position = Self.position(of: item, in: state.devices.values[index], precedence: precedence) {
                state.devices.values[index].insert(item, at: position)
            } else {
                state.devices.values[index].append(item)
            }
            state.lanes.queued(item.lane)
            return nil
        }
        var queue = state.spareQueues.popLast() ?? CircularBuffer<WorkItem>(initialCapacity: 4)
        queue.append(item)
        state.devices[token] = queue
        return item
    }

    /// Where `item` goes in its device's queue when that is not the end: before the sends of
    /// lower precedence that have not started, as far as the last intent to park or mailbox
    /// delivery.
    static func position(of item: WorkItem, in queue: CircularBuffer<WorkItem>, precedence: [Int]) -> CircularBuffer<WorkItem>.Index? {
        let rank = precedence[item.lane]
        let first = queue.index(after: queue.startIndex)
        var position = queue.endIndex
        while position > first {
            let before = queue[queue.index(before: position)]
            guard precedence[before.lane] < rank, case .send = before.admission, before.mailboxMember == nil else { break }
            position = queue.index(before: position)
        }
        return position == queue.endIndex ? nil : position
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
        guard let turn = Self.queueTurn(of: item) else { return nil }
        let (queued, waiters) = state.withLock { state -> (WorkItem?, [CheckedContinuation<Void, Never>]) in
            guard let queued = Self.nextQueued(after: item, turn, parkedUntil: parkedUntil, &state) else { return (nil, []) }
            // One fewer waiting: room for an admitting task if that bound held it.
            return (queued, state.lanes.waitersWithRoom())
        }
        for waiter in waiters { waiter.resume() }
        return queued
    }

    /// The queue whose turn `item` ends: its device's (nil when it queued nowhere), and whether
    /// it became now-or-never behind a parked intent (``parkingBehind(_:due:)``): such an item
    /// ends its turn in the queue too, although a now-or-never admission queues nowhere.
    static func queueTurn(of item: WorkItem) -> (token: String, turnedNowOrNever: Bool)? {
        if let token = item.queueToken { return (token, false) }
        if case .nowOrNever = item.admission, case .success(let intent) = item.intent { return (intent.recipient, true) }
        return nil
    }

    /// ``nextInQueue(after:parkedUntil:)`` inside the state lock, for the turn ``queueTurn(of:)``
    /// found; the caller resumes the admitting tasks the dequeued item made room for
    /// (``LaneLedger/waitersWithRoom()``).
    static func nextQueued(after item: WorkItem, _ turn: (token: String, turnedNowOrNever: Bool), parkedUntil: [String: Int64],
                           _ state: inout State) -> WorkItem? {
        // The token is hashed once.
        guard let index = state.devices.index(forKey: turn.token) else { return nil }
        // One admitted now-or-never (never queued) has no turn to end.
        if turn.turnedNowOrNever, state.devices.values[index].first !== item { return nil }
        state.devices.values[index].removeFirst()
        guard let queued = state.devices.values[index].first else {
            let (_, emptied) = state.devices.remove(at: index)
            if state.spareQueues.count < State.spareQueueLimit, emptied.capacity <= State.spareQueueCapacity {
                state.spareQueues.append(emptied)
            }
            return nil
        }
        state.lanes.dequeued(queued.lane)
        if case .success(let later) = queued.intent, let due = parkedUntil[later.topic],
           let parked = Self.parkingBehind(queued, due: due) {
            let first = state.devices.values[index].startIndex
            state.devices.values[index][first] = parked
            return parked
        }
        return queued
    }
}
