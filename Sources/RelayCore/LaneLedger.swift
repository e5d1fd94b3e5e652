/// How the priority lanes (`kafka.lanes`) share the relay's capacity: per lane its intents in
/// flight (the ones waiting behind an earlier intent of their device among them), the records
/// consumed and not admitted yet (its backlog), and its admitting task while it waits for room.
/// A value type under the pipeline's state lock; with one lane it is the plain bound
/// `limits.max_in_flight` / `limits.max_waiting`.
///
/// - Sends under way (in flight minus waiting) stay below `maxInFlight` in all.
/// - A lane *presses* while it has a backlog or its admitting task waits for room. While other
///   lanes press, a lane may use only its weighted share of `maxInFlight` among the pressing
///   lanes (itself included); when none does, it may use all of it (an idle lane's share goes
///   to the others). So a lane that just got work takes each slot freed by a lane above its
///   share, and no lane starves: each keeps its share while it has work.
/// - Intents waiting behind an earlier one of their device are shared the same way, by weight,
///   out of `maxWaiting`: a bulk lane whose intents crowd a few devices cannot take every place
///   and shut an urgent lane out. With one lane they stay below `maxWaiting`; with several, a
///   lane alone may have taken all of it when another starts pressing, so they may reach twice
///   `maxWaiting` (never more) until the first lane's waiting intents drain below its share.
///
/// What a lane buffers is bounded by the consumer: each lane's intents topic has a librdkafka
/// queue of its own, taken from only while fewer than a limit of its records wait here
/// (``KafkaConsumer/release(topic:records:)``), so one lane's records never stand in front of
/// another's (with one lane, the reader waits for its admitting task instead).
///
/// `Waiter` is what an admitting task leaves while it waits (its continuation).
package struct LaneLedger<Waiter: Sendable>: Sendable {
    package let weights: [Int]
    package let maxInFlight: Int
    package let maxWaiting: Int
    package private(set) var inFlight: [Int]
    package private(set) var waiting: [Int]
    package private(set) var backlog: [Int]
    package private(set) var totalInFlight = 0
    package private(set) var totalWaiting = 0
    /// Per lane, its admitting task's continuation while it waits for room.
    private var waiters: [Waiter?]

    package init(weights: [Int], maxInFlight: Int, maxWaiting: Int) {
        self.weights = weights.isEmpty ? [1] : weights.map { max($0, 1) }
        self.maxInFlight = max(maxInFlight, 1)
        self.maxWaiting = max(maxWaiting, 1)
        let lanes = self.weights.count
        inFlight = Array(repeating: 0, count: lanes)
        waiting = Array(repeating: 0, count: lanes)
        backlog = Array(repeating: 0, count: lanes)
        waiters = Array(repeating: nil, count: lanes)
    }

    package var count: Int { weights.count }

    /// Sends under way in all lanes (in flight, not waiting).
    package var sending: Int { totalInFlight - totalWaiting }

    /// Whether `lane` has work it cannot start yet.
    package func presses(_ lane: Int) -> Bool { backlog[lane] > 0 || waiters[lane] != nil }

    /// How many sends `lane` may have under way now (see the type's rules).
    package func share(_ lane: Int) -> Int {
        share(lane, of: maxInFlight)
    }

    /// `lane`'s weighted part of `limit` among the pressing lanes; all of it when no other
    /// lane presses.
    package func share(_ lane: Int, of limit: Int) -> Int {
        var pressing = weights[lane], others = false
        for other in weights.indices where other != lane && presses(other) {
            pressing += weights[other]
            others = true
        }
        guard others else { return limit }
        return max(1, limit * weights[lane] / pressing)
    }

    /// Whether `lane` may admit another intent now.
    package func hasRoom(_ lane: Int) -> Bool {
        guard sending < maxInFlight else { return false }
        guard weights.count > 1 else { return totalWaiting < maxWaiting }
        return totalWaiting < 2 * maxWaiting && waiting[lane] < share(lane, of: maxWaiting)
            && inFlight[lane] - waiting[lane] < share(lane)
    }

    /// How many more sends mailbox deliveries of `lane` may start now: what is left of
    /// `maxInFlight` in all and, while other lanes press, of the lane's share (so a wave of
    /// parked bulk intents leaves an urgent lane its share).
    package func mailboxRoom(_ lane: Int) -> Int {
        let total = maxInFlight - sending
        guard weights.count > 1 else { return max(total, 0) }
        return max(min(total, share(lane) - (inFlight[lane] - waiting[lane])), 0)
    }

    // MARK: Counting

    package mutating func admitted(_ lane: Int) {
        inFlight[lane] += 1
        totalInFlight += 1
    }

    package mutating func finished(_ lane: Int) {
        inFlight[lane] -= 1
        totalInFlight -= 1
    }

    /// An intent waits behind an earlier one of its device.
    package mutating func queued(_ lane: Int) {
        waiting[lane] += 1
        totalWaiting += 1
    }

    /// A waiting intent starts.
    package mutating func dequeued(_ lane: Int) {
        waiting[lane] -= 1
        totalWaiting -= 1
    }

    /// `records` of `lane` were consumed.
    package mutating func consumed(_ lane: Int, records: Int) {
        backlog[lane] += records
    }

    /// `records` of `lane`'s backlog were admitted (or dropped).
    package mutating func taken(_ lane: Int, records: Int) {
        backlog[lane] = max(backlog[lane] - records, 0)
    }

    // MARK: Waiting for room

    /// Parks `lane`'s admitting task (one per lane).
    package mutating func wait(_ lane: Int, _ continuation: Waiter) {
        waiters[lane] = continuation
    }

    /// Takes `lane`'s waiter out (to resume it: stopping, cancelled).
    package mutating func takeWaiter(_ lane: Int) -> Waiter? {
        defer { waiters[lane] = nil }
        return waiters[lane]
    }

    /// Every waiter out, for a stop.
    package mutating func takeAllWaiters() -> [Waiter] {
        defer { waiters = Array(repeating: nil, count: weights.count) }
        return waiters.compactMap { $0 }
    }

    /// The waiters that have room now, taken out (to resume outside the lock): no more of them
    /// than there are free send slots, each waiter still counting as pressing while the others
    /// are judged, so a lane below its share goes first. (A woken lane admits outside the lock:
    /// a send finishing meanwhile can let another lane in too, so with several lanes the bound
    /// can be passed by one send per other lane, briefly.)
    package mutating func waitersWithRoom() -> [Waiter] {
        let lanes = weights.indices.filter { waiters[$0] != nil && hasRoom($0) }.prefix(max(maxInFlight - sending, 0))
        return lanes.compactMap { takeWaiter($0) }
    }
}
