import Foundation
import Kafka
import RedisTesting
import Testing

@Suite("W3C trace context from intent to outcome", .stopsItsRelays, .timeLimit(.minutes(2)))
struct TraceContextTests {
    static let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    /// An intent's `traceparent` (and `tracestate`) go on with its outcome; an intent without
    /// one, or with one that does not parse, is relayed all the same and its outcome carries none.
    /// With Redis the outcome goes out from the answer's record (another way out): the same.
    @Test(arguments: [false, true]) func theOutcomeCarriesTheIntentsTraceContext(withRedis: Bool) async throws {
        let redis = withRedis ? try await RedisServerProcess.started() : nil
        let harness = try await RelayHarness.start(configureRelay: { if let redis { $0.redis.url = redis.url } })
        func send(_ id: String, token: Int, headers: [KafkaHeader]) async throws {
            _ = try await harness.producer.send(topic: harness.intentsTopic, key: Array(hexToken(token).utf8),
                                                value: Array(intent(id, token: hexToken(token)).utf8), headers: headers)
        }
        try await send("traced", token: 1, headers: [KafkaHeader(name: "traceparent", value: Array(Self.parent.utf8)),
                                                     KafkaHeader(name: "tracestate", value: Array("vendor=abc".utf8))])
        try await send("untraced", token: 2, headers: [KafkaHeader(name: "other", value: Array("x".utf8))])
        try await send("bad-trace", token: 3, headers: [KafkaHeader(name: "traceparent", value: Array("00-zz-00f067aa0ba902b7-01".utf8))])
        try await send("zero-trace", token: 4, headers: [KafkaHeader(
            name: "traceparent", value: Array("00-00000000000000000000000000000000-00f067aa0ba902b7-01".utf8))])

        // A tracestate the parser would trap on (a vendor name of joined characters, 268 bytes):
        // dropped alone, the traceparent goes on.
        let trap = String(repeating: "a\u{200D}", count: 67) + "=x"
        try await send("bad-state", token: 5, headers: [KafkaHeader(name: "traceparent", value: Array(Self.parent.utf8)),
                                                        KafkaHeader(name: "tracestate", value: Array(trap.utf8))])
        let messages = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 5 }
        var byID: [String: KafkaMessage] = [:]
        for message in messages {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any])
            byID[try #require(object["id"] as? String)] = message
            #expect(object["status"] as? String == "delivered", "\(object)")
        }
        #expect(byID.count == 5)
        #expect(byID["bad-state"]?.headers == [KafkaHeader(name: "traceparent", value: Array(Self.parent.utf8))])
        #expect(byID["traced"]?.headers == [KafkaHeader(name: "traceparent", value: Array(Self.parent.utf8)),
                                            KafkaHeader(name: "tracestate", value: Array("vendor=abc".utf8))])
        for id in ["untraced", "bad-trace", "zero-trace"] {
            #expect(byID[id]?.headers == [], "\(id)")
        }
        try await harness.stopExpectingOneOutcomeEach()
    }
}
