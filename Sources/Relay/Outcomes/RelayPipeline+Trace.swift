import Kafka
import W3CTraceContext

extension RelayPipeline {
    /// The W3C trace context of a consumed message: its last `traceparent` header (and
    /// `tracestate`), nil when there is none or it does not parse (the intent is relayed all
    /// the same, without one).
    static func traceContext(_ message: KafkaMessage) -> TraceContext? {
        guard let parent = message.header("traceparent")?.value,
              // 55 characters for version 00; a later version may append fields (bounded here).
              parent.count >= 55, parent.count <= 512 else { return nil }
        let state = message.header("tracestate")?.value.flatMap { $0.count <= 512 ? String(decoding: $0, as: UTF8.self) : nil }
        return try? TraceContext(traceParentHeaderValue: String(decoding: parent, as: UTF8.self), traceStateHeaderValue: state)
    }

    /// The trace headers of an item's outcome: the relay's span as parent when traced here, else
    /// the intent's context as it came (none without one).
    static func outgoingHeaders(_ item: WorkItem) -> [KafkaHeader] {
        item.traced.map { traceHeaders($0.outgoing) } ?? item.trace.map(traceHeaders) ?? []
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
