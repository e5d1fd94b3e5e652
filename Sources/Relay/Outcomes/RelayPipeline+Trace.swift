package import Kafka
package import Tracing
import W3CTraceContext

extension RelayPipeline {
    /// The W3C trace context of a consumed message: its last `traceparent` header (and
    /// `tracestate`), nil when there is none or it does not parse (the intent is relayed all
    /// the same, without one). A `tracestate` that does not parse is dropped alone, as W3C asks.
    ///
    /// Only what the format allows reaches the parser: a version-00 `traceparent` (55 bytes of
    /// lower-case hex and dashes) and a `tracestate` of at most 512 printable ASCII bytes. The
    /// parser counts some lengths in bytes and walks back in characters, and traps on a name
    /// of joined Unicode characters past its limit.
    static func traceContext(_ message: KafkaMessage) -> TraceContext? {
        traceContext(parent: message.header("traceparent")?.value, state: message.header("tracestate")?.value)
    }

    /// ``traceContext(_:)`` of a `traceparent` and a `tracestate` value.
    static func traceContext(parent: [UInt8]?, state: [UInt8]?) -> TraceContext? {
        guard let parent, parent.count == 55,
              parent.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) || $0 == 0x2D }) else { return nil }
        let text = String(decoding: parent, as: UTF8.self)
        guard let context = try? TraceContext(traceParentHeaderValue: text) else { return nil }
        guard let state, !state.isEmpty, state.count <= 512,
              state.allSatisfy({ (0x20...0x7E).contains($0) }) else { return context }
        return (try? TraceContext(traceParentHeaderValue: text, traceStateHeaderValue: String(decoding: state, as: UTF8.self)))
            ?? context
    }

    /// A trace context as a mailbox keeps it beside its entry: `traceparent`, then a newline and
    /// `tracestate` when there is one.
    static func storedTrace(_ trace: TraceContext) -> [UInt8] {
        var stored = Array(trace.traceParentHeaderValue.utf8)
        if let state = trace.traceStateHeaderValue, !state.isEmpty { stored += [0x0A] + Array(state.utf8) }
        return stored
    }

    /// The trace context a mailbox kept (``storedTrace(_:)``), read as carefully as a header: nil
    /// when it does not parse.
    static func traceContext(stored: [UInt8]) -> TraceContext? {
        guard let newline = stored.firstIndex(of: 0x0A) else { return traceContext(parent: stored, state: nil) }
        return traceContext(parent: Array(stored[..<newline]), state: Array(stored[(newline + 1)...]))
    }

    /// The spans of an intent with `trace`: none unless it is sampled and spans are exported
    /// (`tracer`).
    static func intentTrace(_ trace: TraceContext?, tracer: (any Tracer)?,
                            policy: (start: UInt64, end: UInt64)?, id: @autoclosure () -> String?) -> IntentTrace? {
        guard let tracer, let trace, trace.flags.contains(.sampled) else { return nil }
        return IntentTrace(tracer: tracer, parent: trace, policy: policy, id: id())
    }

    /// The trace headers an outcome of `message` carries, through `tracer` as when spans are
    /// exported (the spans it starts are ended at once): what the fuzz target `trace` drives.
    package static func outcomeTraceHeaders(_ message: KafkaMessage, tracer: (any Tracer)?) -> [KafkaHeader] {
        let trace = traceContext(message)
        guard let traced = intentTrace(trace, tracer: tracer, policy: nil, id: nil) else { return trace.map(traceHeaders) ?? [] }
        defer { traced.span.end() }
        return traced.outgoingHeaders
    }

    /// The trace headers of an item's outcome: the relay's span as parent when traced here, else
    /// the intent's context as it came (none without one).
    static func outgoingHeaders(_ item: WorkItem) -> [KafkaHeader] {
        item.traced?.outgoingHeaders ?? item.trace.map(traceHeaders) ?? []
    }

    /// The headers that carry `trace` on to an outcome.
    static func traceHeaders(_ trace: TraceContext) -> [KafkaHeader] {
        var headers = [KafkaHeader(name: "traceparent", value: Array(trace.traceParentHeaderValue.utf8))]
        if let state = trace.traceStateHeaderValue, !state.isEmpty {
            headers.append(KafkaHeader(name: "tracestate", value: Array(state.utf8)))
        }
        return headers
    }
}
