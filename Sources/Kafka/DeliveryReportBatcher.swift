import Common

/// Hands delivery reports over a batch at a time: the reports of records sent with
/// ``KafkaProducer/send(topic:partition:key:value:headers:slot:to:)`` that one poll of
/// librdkafka served reach the handler in one call, on the thread that polled (the producer's
/// poll thread, or one flushing or closing it). A partition's reports come in its records'
/// order, except while a flush polls beside the poll thread: then the two may hand over
/// reports of one partition out of order, or in overlapping batches. A record librdkafka refuses at once (its queue full, the producer
/// closed) is handed over at once, alone, on the sending thread.
///
/// For a caller whose work per report shrinks when it comes in batches: one lock for many
/// records, one offset store for many intents. Made with ``KafkaProducer/reportBatcher(_:)``;
/// the producer keeps it.
///
/// A record is named by a `slot`, an integer of the caller's (the index of what the record's
/// report concludes, in a table the caller keeps): it travels in the record's opaque pointer
/// with the batcher's index (``BatchedOpaque``), so a send allocates nothing for its report.
public final class DeliveryReportBatcher: Sendable {
    public typealias Report = (slot: Int, result: Result<KafkaProducer.Delivery, KafkaError>)

    /// Its place among its producer's batchers: part of its records' opaques.
    let index: Int
    /// Its producer's callbacks: a record's report finds its batcher by index among those of
    /// the producer that sent it, so only that producer may send with it.
    let owner: ObjectIdentifier

    /// Reports served and not handed over yet: appended by librdkafka's delivery-report callback,
    /// taken whole after the poll that served them. At most the records in flight.
    private let pending = Locked<[Report]>([])
    private let handler: LockedFunction<@Sendable ([Report]) -> Void>

    init(index: Int, owner: ObjectIdentifier, _ handler: (@Sendable ([Report]) -> Void)?) {
        self.index = index
        self.owner = owner
        self.handler = LockedFunction(handler)
    }

    /// Sets (or replaces) the handler: for a maker that needs the batcher before it can make
    /// its handler. Reports that come before a handler is set are held until one is.
    public func deliver(to handler: @escaping @Sendable ([Report]) -> Void) {
        self.handler.set(handler)
        dispatch()
    }

    func append(_ slot: Int, _ result: Result<KafkaProducer.Delivery, KafkaError>) {
        pending.withLock { $0.append((slot, result)) }
    }

    /// Hands the reports served since the last call to the handler, if any.
    func dispatch() {
        guard let handler = handler.current else { return }
        let reports = pending.withLock { pending -> [Report] in
            guard !pending.isEmpty else { return [] }
            let count = pending.count
            let taken = pending.take()
            // The next poll's reports go into storage of about this batch's size at once (a
            // burst's size is not kept).
            pending.reserveCapacity(min(count, 1024))
            return taken
        }
        if !reports.isEmpty { handler(reports) }
    }

    /// A record refused at once: its report alone, now.
    func refused(_ slot: Int, _ error: KafkaError) {
        if let handler = handler.current { return handler([(slot, .failure(error))]) }
        append(slot, .failure(error))
        // A handler set meanwhile (``deliver(to:)``) may have dispatched before the append.
        dispatch()
    }
}

/// A batched record's opaque pointer: its batcher's index and its slot, tagged by the low bit.
/// The producer's other records carry an object's address as their opaque, whose low bit is 0
/// (objects are aligned), so the delivery-report callback tells the two apart.
enum BatchedOpaque {
    /// Batchers per producer, at most (their index takes the bits above the tag).
    static let batchers = 1 << 15
    /// Slots, at most: 47 bits, the pointer's 64 less the tag and the batcher's 15 and one to
    /// spare (a slot stays a positive `Int`).
    static let slots = 1 << 47

    static func make(batcher: Int, slot: Int) -> UnsafeMutableRawPointer {
        precondition(slot >= 0 && slot < slots, "a batched record's slot is 0 to 2^47 - 1")
        return UnsafeMutableRawPointer(bitPattern: UInt(slot) << 16 | UInt(batcher) << 1 | 1)!
    }

    /// The batcher's index and the slot of a batched record's opaque; nil for an object's.
    static func split(_ opaque: UnsafeMutableRawPointer) -> (batcher: Int, slot: Int)? {
        let bits = UInt(bitPattern: opaque)
        guard bits & 1 == 1 else { return nil }
        return (Int(bits >> 1 & UInt(batchers - 1)), Int(bits >> 16))
    }
}

extension Array {
    /// The array's elements, leaving it empty.
    fileprivate mutating func take() -> [Element] {
        var taken: [Element] = []
        swap(&self, &taken)
        return taken
    }
}
