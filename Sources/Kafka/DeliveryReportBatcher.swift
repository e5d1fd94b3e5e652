import Common

/// Hands delivery reports over a batch at a time: the reports of records sent with
/// ``KafkaProducer/send(topic:partition:key:value:headers:token:to:)`` that one poll of
/// librdkafka served reach the handler in one call, on the thread that polled (the producer's
/// poll thread, or one flushing or closing it). A partition's reports come in its records'
/// order, except while a flush polls beside the poll thread: then the two may hand over
/// reports of one partition out of order, or in overlapping batches. A record librdkafka refuses at once (its queue full, the producer
/// closed) is handed over at once, alone, on the sending thread.
///
/// For a caller whose work per report shrinks when it comes in batches: one lock for many
/// records, one offset store for many intents. Made with ``KafkaProducer/reportBatcher(_:)``;
/// the producer keeps it.
public final class DeliveryReportBatcher<Token: Sendable>: Sendable {
    public typealias Report = (token: Token, result: Result<KafkaProducer.Delivery, KafkaError>)

    /// Reports served and not handed over yet: appended by librdkafka's delivery-report callback,
    /// taken whole after the poll that served them. At most the records in flight.
    private let pending = Locked<[Report]>([])
    private let handler: LockedFunction<@Sendable ([Report]) -> Void>

    init(_ handler: (@Sendable ([Report]) -> Void)?) {
        self.handler = LockedFunction(handler)
    }

    /// Sets (or replaces) the handler: for a maker that needs the batcher before it can make
    /// its handler. Reports that come before a handler is set are held until one is.
    public func deliver(to handler: @escaping @Sendable ([Report]) -> Void) {
        self.handler.set(handler)
        dispatch()
    }

    func append(_ token: Token, _ result: Result<KafkaProducer.Delivery, KafkaError>) {
        pending.withLock { $0.append((token, result)) }
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
    func refused(_ token: Token, _ error: KafkaError) {
        if let handler = handler.current { return handler([(token, .failure(error))]) }
        append(token, .failure(error))
        // A handler set meanwhile (``deliver(to:)``) may have dispatched before the append.
        dispatch()
    }
}

/// What the producer asks of its batchers after each poll, whatever their token type.
protocol DeliveryReportDispatching: AnyObject, Sendable {
    func dispatch()
}

extension DeliveryReportBatcher: DeliveryReportDispatching {}

extension Array {
    /// The array's elements, leaving it empty.
    fileprivate mutating func take() -> [Element] {
        var taken: [Element] = []
        swap(&self, &taken)
        return taken
    }
}
