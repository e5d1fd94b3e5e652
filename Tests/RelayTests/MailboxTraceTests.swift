import Foundation
import Kafka
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// An intent parked in its device's mailbox and answered later, by whichever relay takes it,
/// keeps its trace context: Redis holds it beside the entry.
@Suite("Trace context through a device's mailbox", .stopsItsRelays, .timeLimit(.minutes(2)), .enabled(if: RelayTracing.isBuiltIn, "built without OTLPExport"))
struct MailboxTraceTests {
    static let traceID = "0af7651916cd43dd8448eb211c80319c", parentID = "b7ad6b7169203331"

    /// Burst 1, a token every 2 s: the second intent for the device waits in its mailbox about
    /// 2 s. Its outcome carries its `traceparent` and `tracestate`; with spans exported,
    /// under the relay's span for it (a child of the intent's parent, with its id). Its trace
    /// leaves the mailbox with it.
    @Test(arguments: [false, true]) func aParkedIntentsOutcomeCarriesItsTrace(exported: Bool) async throws {
        let redis = try await RedisServerProcess.started()
        let receiver = try await OTLPReceiver()
        let harness = try await PolicyTests.harness(redis, burst: 1, refill: 0.5, configure: {
            if exported {
                $0.tracing.otlpEndpoint = receiver.url
                }
        })
        let token = hexToken(7)
        func send(_ id: String, _ headers: [KafkaHeader]) async throws {
            _ = try await harness.producer.send(topic: harness.intentsTopic, key: Array(token.utf8),
                                                value: Array(intent(id, token: token).utf8), headers: headers)
        }
        try await send("goes-first", [])
        try await send("waits", [KafkaHeader(name: "traceparent", value: Array("00-\(Self.traceID)-\(Self.parentID)-01".utf8)),
                                 KafkaHeader(name: "tracestate", value: Array("vendor=abc".utf8))])
        let messages = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 2 }
        let waited = try #require(messages.first { String(decoding: $0.value, as: UTF8.self).contains(#""id":"waits""#) })
        let outcome = try #require(try JSONSerialization.jsonObject(with: Data(waited.value)) as? [String: Any])
        #expect(outcome["status"] as? String == "delivered")
        // It went out of the mailbox: its token came about 2 s after the first's.
        #expect((outcome["latency_ms"] as? Int ?? 0) >= 1000, "\(outcome)")
        #expect(waited.header("tracestate")?.value == Array("vendor=abc".utf8))
        if exported {
            // Two spans for it: consumed to parked, then taken from the mailbox to its outcome.
            func spans(_ status: String) -> [[String: Any]] {
                receiver.spans.filter {
                    let attributes = OTLPReceiver.attributes($0)
                    return attributes["apns_relay.intent.id"] == "waits" && attributes["apns_relay.outcome.status"] == status
                }
            }
            try await waitUntil(timeout: .seconds(20)) { !spans("parked").isEmpty && !spans("delivered").isEmpty }
            #expect(spans("parked").first?["parentSpanId"] as? String == Self.parentID)
            let span = try #require(spans("delivered").first)
            #expect(span["traceId"] as? String == Self.traceID)
            #expect(span["parentSpanId"] as? String == Self.parentID)
            let spanID = try #require(span["spanId"] as? String)
            #expect(waited.header("traceparent")?.value == Array("00-\(Self.traceID)-\(spanID)-01".utf8))
            let children = receiver.spans.filter { $0["parentSpanId"] as? String == spanID }.compactMap { $0["name"] as? String }
            #expect(Set(children) == ["apns send", "kafka publish outcome"], "\(children)")
        } else {
            #expect(waited.header("traceparent")?.value == Array("00-\(Self.traceID)-\(Self.parentID)-01".utf8))
        }
        // The trace leaves the mailbox with its entry, once the outcome is out.
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        var fields: [String] = []
        try await waitUntil(asking: {
            fields = (try? await client.send(RedisCommand("HKEYS", [mailbox])))?.array?.compactMap(\.string) ?? ["?"]
            return !fields.contains("cid")
        })
        #expect(!fields.contains { $0.hasPrefix("t:") }, "\(fields)")
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
        await receiver.stop()
    }
}
