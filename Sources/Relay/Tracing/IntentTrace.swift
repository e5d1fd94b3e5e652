import Crypto
import Foundation
import Kafka
import Common
import Synchronization
import Tracing
import W3CTraceContext

/// Epoch nanoseconds from the system clock (span times are wall-clock times).
func wallNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// One traced intent's spans: `apns-relay intent` (a child of the intent's `traceparent`,
/// started at admission, ended at the outcome's delivery report) and, under it, `redis policy`
/// (the batch's admission round trip, with Redis), `apns send` (the first try to the last
/// answer) and `kafka publish outcome`. The children are started and ended, at the times
/// recorded here, when the outcome is out: an intent costs its tracer one span until then.
/// An intent whose work ends without an outcome (parked in its mailbox, its partition revoked,
/// abandoned at shutdown) ends its span then (``end(without:)``): the tracer keeps every open
/// span.
///
/// Made only for intents whose trace context is sampled, and only when spans are exported: the
/// relay continues traces, it does not start them.
final class IntentTrace: Sendable {
    let tracer: any Tracer
    /// `apns-relay intent`.
    let span: any Span
    let policy: (start: UInt64, end: UInt64)?
    private let marks = Locked(Marks())
    /// Set once the intent span ended (by whichever of ``finish(_:partition:offset:)`` and
    /// ``end(without:)`` came first).
    private let ended = Atomic<Bool>(false)

    private struct Marks {
        var sendStart: UInt64?
        var sendEnd: UInt64?
        var tries = 0
        var publishStart: UInt64?
    }

    /// `id`: the intent's, when it parsed (an attribute from the start).
    init(tracer: any Tracer, parent: TraceContext, policy: (start: UInt64, end: UInt64)?, id: String? = nil) {
        self.tracer = tracer
        var context = ServiceContext.topLevel
        tracer.extract(parent, into: &context, using: TraceContextExtractor())
        span = tracer.startSpan("apns-relay intent", context: context, ofKind: .consumer,
                                at: WallInstant(policy?.start ?? wallNanoseconds()))
        if let id { span.attributes["apns_relay.intent.id"] = id }
        self.policy = policy
    }

    /// The trace headers the outcome carries: the same trace, with the relay's span as parent.
    var outgoingHeaders: [KafkaHeader] {
        var headers: [KafkaHeader] = []
        tracer.inject(span.context, into: &headers, using: KafkaHeaderInjector())
        return headers
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

    /// Ends the spans, the outcome published now. Never the device token: its SHA-256, 16 hex
    /// digits.
    func finish(_ outcome: Outcome, partition: Int32, offset: Int64) {
        guard !ended.exchange(true, ordering: .relaxed) else { return }
        let end = wallNanoseconds()
        let marks = marks.withLock { $0 }
        span.updateAttributes { attributes in
            attributes["apns_relay.intent.id"] = outcome.id ?? ""
            attributes["apns_relay.outcome.status"] = outcome.status.rawValue
            attributes["messaging.kafka.partition"] = Int64(partition)
            attributes["messaging.kafka.offset"] = offset
            if let topic = outcome.topic { attributes["apns.topic"] = topic }
            if let token = outcome.token { attributes["apns_relay.token.sha256"] = Self.tokenHash(token) }
            if let channelID = outcome.channelID { attributes["apns_relay.channel_id"] = "\(channelID)" }
            if let reason = outcome.reason { attributes["apns_relay.outcome.reason"] = reason }
        }
        if outcome.status == .failed { span.setStatus(SpanStatus(code: .error, message: outcome.reason)) }
        if let policy { child("redis policy", .client, from: policy.start, to: policy.end) }
        if let sendStart = marks.sendStart {
            let status = outcome.httpStatus
            child("apns send", .client, from: sendStart, to: marks.sendEnd ?? end, failed: (status ?? 200) >= 500) { attributes in
                attributes["apns_relay.tries"] = Int64(marks.tries)
                if let status { attributes["apns.status"] = Int64(status) }
                if let apnsID = outcome.apnsID { attributes["apns.id"] = apnsID }
            }
        }
        if let publishStart = marks.publishStart { child("kafka publish outcome", .producer, from: publishStart, to: end) }
        span.end(at: WallInstant(end))
    }

    /// Ends the spans of an intent whose work ended without an outcome from this relay:
    /// `state` (`parked`, `unfinished`) stands for its status. Nothing when they ended already.
    func end(without state: String) {
        guard !ended.exchange(true, ordering: .relaxed) else { return }
        let end = wallNanoseconds()
        let marks = marks.withLock { $0 }
        span.updateAttributes { $0["apns_relay.outcome.status"] = state }
        if let policy { child("redis policy", .client, from: policy.start, to: policy.end) }
        if let sendStart = marks.sendStart {
            child("apns send", .client, from: sendStart, to: marks.sendEnd ?? end) { $0["apns_relay.tries"] = Int64(marks.tries) }
        }
        span.end(at: WallInstant(end))
    }

    private func child(_ name: String, _ kind: SpanKind, from start: UInt64, to end: UInt64, failed: Bool = false,
                       _ attributes: (inout SpanAttributes) -> Void = { _ in }) {
        let child = tracer.startSpan(name, context: span.context, ofKind: kind, at: WallInstant(start))
        child.updateAttributes(attributes)
        if failed { child.setStatus(SpanStatus(code: .error)) }
        child.end(at: WallInstant(end))
    }

    /// 16 hex digits of the token's SHA-256, written out digit by digit (no per-byte
    /// formatting: this runs for every traced intent).
    static func tokenHash(_ token: String) -> String {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        var hex: [UInt8] = []
        hex.reserveCapacity(16)
        for byte in SHA256.hash(data: Array(token.utf8)).prefix(8) {
            hex.append(digits[Int(byte >> 4)])
            hex.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: hex, as: UTF8.self)
    }
}
