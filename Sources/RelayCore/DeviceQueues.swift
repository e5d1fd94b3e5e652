public import NIOCore

/// What ``DeviceQueues`` needs of an item: one intent on its way from consume to outcome (the
/// relay's `WorkItem`). A class: the queues hold references, not copies.
public protocol DeviceQueueItem: AnyObject {
    /// Its lane (its precedence among a device's sends: ``DeviceQueues/precedence``).
    var lane: Int { get }
    /// The number of the partition it was consumed from (of its lane's topic).
    var partitionNumber: Int32 { get }
    var admission: BatchAdmission.Admission { get }
    var intent: Result<Intent, InvalidIntent> { get }
    /// Taken from a mailbox: its due-index member.
    var mailboxMember: String? { get }
    /// Counted in ``DeviceQueues/answering`` from its enqueueing until its slot is freed.
    var holdsAnswer: Bool { get }
    /// The device (or channel) whose queue it waits in; nil for one that queues nowhere.
    var queueToken: String? { get }
    /// The same item with another admission (an intent to send that parks behind its device's
    /// parked one, ``DeviceQueues/parkingBehind(_:due:)``).
    func withAdmission(_ admission: BatchAdmission.Admission) -> Self
}

/// An intent whose answer an item in its recipient's queue records: a copy consumed meanwhile is
/// answered `duplicate` of it, looked up without scanning the queue.
public struct AnswerKey: Hashable, Sendable {
    public var recipient: String
    public var topic: String
    public var id: String

    @inlinable
    public init(_ intent: Intent) {
        recipient = intent.recipient
        topic = intent.topic
        id = intent.id
    }
}

/// What a batch's admission read of Redis may have missed (``DeviceQueues/recentAnswers``).
public enum RecentChange: Hashable, Sendable {
    /// APNs' answer to the intent was recorded (a copy of it is a duplicate).
    case answered(AnswerKey)
    /// An intent was parked in this device (or channel) and app's mailbox (the others wait
    /// behind it).
    case parked(recipient: String, topic: String)
    /// An intent of this device was parked after a 429: the device is in backoff for every app.
    case backedOff(recipient: String)
}

/// The relay's devices' queues: per device (or channel, ``Intent/recipient``), its items that
/// are sent or parked, in order (the first is under way, the others wait for it); which intents
/// those items answer for; and what admission reads under way may have missed (answers
/// recorded, parks). A pure value: whoever owns it serializes its use (a pipeline shard's
/// lock). The lanes' counts of
/// queued items are the caller's: ``enqueue(_:)`` and ``nextQueued(after:_:parkedUntil:)`` say
/// what was queued and dequeued.
///
/// Public, its methods inlinable: the relay's items are one concrete class, and each intent
/// passes here several times, where unspecialized generic code pays for every dictionary and
/// buffer operation through metadata. (`@inlinable package` methods are not specialized in
/// another module: docs/architecture.md, hot-path rule 4.)
public struct DeviceQueues<Item: DeviceQueueItem> {
    /// Per device token, its items that are sent or parked, in order.
    @usableFromInline package var devices: [String: CircularBuffer<Item>] = [:]
    /// Emptied device queues kept for the next device that has none, so that a device's first
    /// intent does not allocate a queue (most devices have one intent at a time): at most
    /// ``spareQueueLimit`` of them, none that grew past ``spareQueueCapacity``.
    @usableFromInline package var spareQueues: [CircularBuffer<Item>] = []
    @inlinable public static var spareQueueLimit: Int { 256 }
    @inlinable public static var spareQueueCapacity: Int { 16 }
    /// The intents items in ``devices`` record answers for (how many such items each).
    @usableFromInline package var answering: [AnswerKey: Int] = [:]
    /// Answers recorded, and mailboxes parked into, while batches' admission reads were under
    /// way.
    @usableFromInline package var recentAnswers = RecentAnswers<RecentChange>()
    /// The mark of the latest park in ``recentAnswers`` (0: none yet).
    @usableFromInline package var lastParkMark: UInt64 = 0
    /// Consumed intents queued so far behind an intent of their device (or channel) consumed
    /// from another partition number (compared with the latest consumed intent in the queue;
    /// mailbox deliveries carry their due index's partition): their producers key intents by
    /// something other than the device token (docs/intents.md), or their lanes' topics have
    /// different partition counts. Their order here is consumption order, not the producer's,
    /// and two relays can hold them at once.
    @usableFromInline package var acrossPartitions = 0
    /// Each lane's precedence among a device's sends waiting for an APNs stream (see
    /// ``enqueue(_:)``); one lane or one weight: no overtaking.
    @usableFromInline package let precedence: [Int]

    public init(precedence: [Int] = []) {
        self.precedence = precedence
    }

    /// Queues an item behind its device's earlier ones; returns it when it can start now (nil:
    /// it was queued behind them, and counts as waiting).
    ///
    /// With lanes (``precedence``), an intent to send waits behind its device's items of its own
    /// lane and of higher precedence only: it goes ahead of those of lower precedence that are
    /// sends not started (the queue's first item runs). So an urgent intent does not wait for
    /// every bulk intent queued for its device, and each lane's intents keep their order. It
    /// never goes ahead of an intent to park (that one would park after it and displace it from
    /// the mailbox, newer as it is) or of a mailbox delivery, and other admissions (a duplicate,
    /// a known 410) stay behind the intent they answer for. Inserting copies the queue's
    /// storage: only overtaking pays it.
    @inlinable
    public mutating func enqueue(_ item: Item) -> Item? {
        guard let token = item.queueToken else { return item }
        if item.holdsAnswer, case .success(let intent) = item.intent { answering[AnswerKey(intent), default: 0] += 1 }
        // The token is hashed once (a device's queue is looked up by it several times per intent).
        if let index = devices.index(forKey: token) {
            if item.mailboxMember == nil, let number = latestConsumedPartition(at: index), number != item.partitionNumber {
                acrossPartitions += 1
            }
            // No copy of the queue is held while it changes (that would copy its storage).
            if precedence.count > 1, case .send = item.admission, item.mailboxMember == nil,
               let position = Self.position(of: item, in: devices.values[index], precedence: precedence) {
                devices.values[index].insert(item, at: position)
            } else {
                devices.values[index].append(item)
            }
            return nil
        }
        var queue = spareQueues.popLast() ?? CircularBuffer<Item>(initialCapacity: 4)
        queue.append(item)
        devices[token] = queue
        return item
    }

    /// The partition number of the last item of the queue at `index` in ``devices`` that was
    /// consumed (not a mailbox delivery). Read in place: a copy of the queue held while it then
    /// changes would copy its storage.
    @inlinable
    public func latestConsumedPartition(at index: Dictionary<String, CircularBuffer<Item>>.Index) -> Int32? {
        var position = devices.values[index].endIndex
        while position > devices.values[index].startIndex {
            position = devices.values[index].index(before: position)
            if devices.values[index][position].mailboxMember == nil { return devices.values[index][position].partitionNumber }
        }
        return nil
    }

    /// Where `item` goes in its device's queue when that is not the end: before the sends of
    /// lower precedence that have not started, as far as the last intent to park or mailbox
    /// delivery.
    @inlinable
    public static func position(of item: Item, in queue: CircularBuffer<Item>, precedence: [Int]) -> CircularBuffer<Item>.Index? {
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

    /// The queue whose turn `item` ends: its device's (nil when it queued nowhere), and whether
    /// it became now-or-never behind a parked intent (``parkingBehind(_:due:)``): such an item
    /// ends its turn in the queue too, although a now-or-never admission queues nowhere.
    @inlinable
    public static func turn(of item: Item) -> (token: String, turnedNowOrNever: Bool)? {
        if let token = item.queueToken { return (token, false) }
        if case .nowOrNever = item.admission, case .success(let intent) = item.intent { return (intent.recipient, true) }
        return nil
    }

    /// Ends `item`'s turn in its device's queue (``turn(of:)``) and returns the item queued
    /// behind it, now no longer waiting, to start (parking behind a parked one of its app:
    /// `parkedUntil`, per topic, when the device's last parked intent is due).
    @inlinable
    public mutating func nextQueued(after item: Item, _ turn: (token: String, turnedNowOrNever: Bool),
                                     parkedUntil: [String: Int64]) -> Item? {
        // The token is hashed once.
        guard let index = devices.index(forKey: turn.token) else { return nil }
        // One admitted now-or-never (never queued) has no turn to end.
        if turn.turnedNowOrNever, devices.values[index].first !== item { return nil }
        devices.values[index].removeFirst()
        guard let queued = devices.values[index].first else {
            let (_, emptied) = devices.remove(at: index)
            if spareQueues.count < Self.spareQueueLimit, emptied.capacity <= Self.spareQueueCapacity {
                spareQueues.append(emptied)
            }
            return nil
        }
        if !parkedUntil.isEmpty, case .success(let later) = queued.intent, let due = parkedUntil[later.topic],
           let parked = Self.parkingBehind(queued, due: due) {
            let first = devices.values[index].startIndex
            devices.values[index][first] = parked
            return parked
        }
        return queued
    }

    /// `queued`, an intent consumed to be sent behind an intent of its device and app that
    /// parked until `due`, as one to park at `due` (or, now-or-never, to end `expired`: it
    /// cannot wait); nil when it is not such an intent.
    @inlinable
    public static func parkingBehind(_ queued: Item, due: Int64) -> Item? {
        guard case .send = queued.admission, queued.mailboxMember == nil,
              case .success(let later) = queued.intent else { return nil }
        return queued.withAdmission(later.expiration == 0 ? .nowOrNever : .park(due: due))
    }

    /// The item's slot is free: it no longer counts among the copies in flight that answer for
    /// the copies admitted after it (``DeviceQueueItem/holdsAnswer``); the last of them marks
    /// the answer for the reads under way.
    @inlinable
    public mutating func answerFreed(by item: Item) {
        guard item.holdsAnswer, case .success(let intent) = item.intent else { return }
        let key = AnswerKey(intent)
        if let count = answering[key], count > 1 {
            answering[key] = count - 1
        } else {
            answering[key] = nil
            recentAnswers.answered(.answered(key))
        }
    }

    /// Whether the read marked `readMark` missed a park into the intent's device and app's
    /// mailbox, or a 429 backoff of its device: sent now, the intent would overtake the parked
    /// one, or go out inside the backoff. Looked up only when a park came after the read
    /// (``lastParkMark``): parks are rare, sends are not.
    @inlinable
    public func missedPark(_ intent: Intent, since readMark: UInt64) -> Bool {
        guard lastParkMark > readMark else { return false }
        return recentAnswers.answered(.parked(recipient: intent.recipient, topic: intent.topic), since: readMark)
            || recentAnswers.answered(.backedOff(recipient: intent.recipient), since: readMark)
    }

    /// Notes a park of `intent` (after a 429: `tooManyRequests`) for the reads under way
    /// (``missedPark(_:since:)``).
    @inlinable
    public mutating func noteParked(_ intent: Intent, tooManyRequests: Bool) {
        recentAnswers.answered(.parked(recipient: intent.recipient, topic: intent.topic))
        if tooManyRequests { recentAnswers.answered(.backedOff(recipient: intent.recipient)) }
        lastParkMark = recentAnswers.latestMark
    }
}
