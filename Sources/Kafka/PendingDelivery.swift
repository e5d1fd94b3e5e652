import Common

/// A record handed to the producer whose delivery report one task awaits later
/// (``KafkaProducer/startSending(topic:key:value:headers:)``): the report may come before the
/// wait starts or after; either way ``report()`` returns it.
///
/// The wait is not cancellable: every record gets its report (at the latest when librdkafka's
/// `message.timeout.ms` passes, or when the producer closes and fails what is left).
public final class PendingDelivery: Sendable {
    public typealias Report = Result<KafkaProducer.Delivery, KafkaError>

    private enum State {
        case sent
        case waiting(UnsafeContinuation<Report, Never>)
        case reported(Report)
    }

    private let state = Locked(State.sent)

    init() {}

    func resolve(_ report: Report) {
        let waiting = state.withLock { state -> UnsafeContinuation<Report, Never>? in
            guard case .waiting(let continuation) = state else {
                state = .reported(report)
                return nil
            }
            state = .reported(report)
            return continuation
        }
        waiting?.resume(returning: report)
    }

    /// The delivery report, once it came. Awaited by one task at most.
    public func report() async -> Report {
        await withUnsafeContinuation { continuation in
            let ready = state.withLock { state -> Report? in
                if case .reported(let report) = state { return report }
                state = .waiting(continuation)
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

extension KafkaProducer {
    /// Hands the record over now and returns at once; its delivery report is awaited later
    /// with ``PendingDelivery/report()``. For a record that goes out beside another one the
    /// caller waits for first, so that the two waits overlap.
    public func startSending(topic: String, key: [UInt8]?, value: [UInt8]?, headers: [KafkaHeader] = []) -> PendingDelivery {
        let pending = PendingDelivery()
        send(topic: topic, key: key, value: value, headers: headers) { pending.resolve($0) }
        return pending
    }
}
