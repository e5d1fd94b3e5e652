import Crypto
import Foundation
import Synchronization
import W3CTraceContext

/// Epoch nanoseconds from the system clock (span times are wall-clock times).
func wallNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// One finished span, as OTLP takes it.
struct FinishedSpan: Sendable {
    /// OTLP's `SpanKind`.
    enum Kind: Int, Sendable {
        case `internal` = 1, client = 3, producer = 4, consumer = 5
    }

    enum Attribute: Sendable {
        case string(String)
        case int(Int64)
    }

    var traceID: TraceID
    var spanID: SpanID
    var parentSpanID: SpanID?
    var name: String
    var kind: Kind
    var start: UInt64
    var end: UInt64
    var attributes: [(String, Attribute)]
    var failed = false
}

/// The times of one traced intent on its way, kept until its outcome is published; then its
/// spans: `apns-relay intent` (a child of the intent's `traceparent`: from admission to the
/// outcome's delivery report) with `redis policy` (the batch's admission round trip, with Redis),
/// `apns send` (the first try to the last answer) and `kafka publish outcome`.
///
/// Made only for intents whose trace context is sampled, and only when spans are exported: the
/// relay continues traces, it does not start them.
final class IntentTrace: Sendable {
    let parent: TraceContext
    let spanID: SpanID
    let start: UInt64
    let policy: (start: UInt64, end: UInt64)?
    private let marks = Mutex(Marks())

    private struct Marks {
        var sendStart: UInt64?
        var sendEnd: UInt64?
        var tries = 0
        var publishStart: UInt64?
    }

    init(parent: TraceContext, policy: (start: UInt64, end: UInt64)?) {
        self.parent = parent
        self.spanID = SpanID.random()
        self.start = policy?.start ?? wallNanoseconds()
        self.policy = policy
    }

    /// The trace context the outcome carries: the same trace, with the relay's span as parent.
    var outgoing: TraceContext {
        TraceContext(traceID: parent.traceID, spanID: spanID, flags: parent.flags, state: parent.state)
    }

    func sendBegins() {
        let now = wallNanoseconds()
        marks.withLock { marks in
            if marks.sendStart == nil { marks.sendStart = now }
            marks.tries += 1
        }
    }

    func sendEnds() {
        let now = wallNanoseconds()
        marks.withLock { $0.sendEnd = now }
    }

    func publishBegins() {
        let now = wallNanoseconds()
        marks.withLock { if $0.publishStart == nil { $0.publishStart = now } }
    }

    /// The spans, the outcome published now. Never the device token: its SHA-256, 16 hex digits.
    func spans(_ outcome: Outcome, partition: Int32, offset: Int64) -> [FinishedSpan] {
        let end = wallNanoseconds()
        let marks = marks.withLock { $0 }
        let trace = parent.traceID
        var attributes: [(String, FinishedSpan.Attribute)] = [
            ("apns_relay.intent.id", .string(outcome.id ?? "")),
            ("apns_relay.outcome.status", .string(outcome.status.rawValue)),
            ("messaging.kafka.partition", .int(Int64(partition))),
            ("messaging.kafka.offset", .int(offset)),
        ]
        if let topic = outcome.topic { attributes.append(("apns.topic", .string(topic))) }
        if let token = outcome.token { attributes.append(("apns_relay.token.sha256", .string(Self.tokenHash(token)))) }
        if let reason = outcome.reason { attributes.append(("apns_relay.outcome.reason", .string(reason))) }
        var spans = [FinishedSpan(traceID: trace, spanID: spanID, parentSpanID: parent.spanID, name: "apns-relay intent",
                                  kind: .consumer, start: start, end: end, attributes: attributes,
                                  failed: outcome.status == .failed)]
        if let policy {
            spans.append(FinishedSpan(traceID: trace, spanID: .random(), parentSpanID: spanID, name: "redis policy",
                                      kind: .client, start: policy.start, end: policy.end, attributes: []))
        }
        if let sendStart = marks.sendStart {
            var send: [(String, FinishedSpan.Attribute)] = [("apns_relay.tries", .int(Int64(marks.tries)))]
            if let status = outcome.httpStatus { send.append(("apns.status", .int(Int64(status)))) }
            if let apnsID = outcome.apnsID { send.append(("apns.id", .string(apnsID))) }
            spans.append(FinishedSpan(traceID: trace, spanID: .random(), parentSpanID: spanID, name: "apns send",
                                      kind: .client, start: sendStart, end: marks.sendEnd ?? end, attributes: send,
                                      failed: (outcome.httpStatus ?? 200) >= 500))
        }
        if let publishStart = marks.publishStart {
            spans.append(FinishedSpan(traceID: trace, spanID: .random(), parentSpanID: spanID, name: "kafka publish outcome",
                                      kind: .producer, start: publishStart, end: end, attributes: []))
        }
        return spans
    }

    static func tokenHash(_ token: String) -> String {
        SHA256.hash(data: Array(token.utf8)).prefix(8).map { String(format: "%02x", $0) }.joined()
    }
}
