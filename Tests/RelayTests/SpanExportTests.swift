import Foundation
import Kafka
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
@testable import Relay
import RedisTesting
import Synchronization
import TestSupport
import Testing
import W3CTraceContext

/// An OTLP/HTTP collector in this process: every `POST /v1/traces` body, answered 200.
final class OTLPReceiver: Sendable {
    /// What the connections' handlers share.
    final class Store: Sendable {
        /// The bodies, as received (parsed when read).
        let received = Mutex<[[UInt8]]>([])

        func take(_ path: String, _ body: [UInt8]) -> Int {
            guard path == "/v1/traces" else { return 404 }
            received.withLock { $0.append(body) }
            return 200
        }
    }

    private let channel: any Channel
    private let store = Store()

    var url: String { "http://127.0.0.1:\(channel.localAddress!.port!)" }

    /// Every span received so far.
    var spans: [[String: Any]] {
        store.received.withLock { $0 }.flatMap { body -> [[String: Any]] in
                let request = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
                let resources = request["resourceSpans"] as? [[String: Any]] ?? []
                return resources.flatMap { resource in
                    (resource["scopeSpans"] as? [[String: Any]] ?? []).flatMap { $0["spans"] as? [[String: Any]] ?? [] }
                }
        }
    }

    init() async throws {
        let store = self.store
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(Collector(store))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    func stop() async { try? await channel.close() }

    private final class Collector: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let store: Store
        var path = ""
        var body: [UInt8] = []

        init(_ store: Store) { self.store = store }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                path = head.uri
                body = []
            case .body(var buffer):
                body += buffer.readBytes(length: buffer.readableBytes) ?? []
            case .end:
                let status = store.take(path, body)
                var headers = HTTPHeaders()
                headers.add(name: "content-length", value: "2")
                context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: status),
                                                                     headers: headers))), promise: nil)
                context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "{}")))), promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            }
        }
    }
}

@Suite("Spans to an OTLP/HTTP collector", .timeLimit(.minutes(2)))
struct SpanExportTests {
    static func attributes(_ span: [String: Any]) -> [String: String] {
        var result: [String: String] = [:]
        for attribute in span["attributes"] as? [[String: Any]] ?? [] {
            guard let key = attribute["key"] as? String, let value = attribute["value"] as? [String: Any] else { continue }
            result[key] = (value["stringValue"] as? String) ?? (value["intValue"] as? String)
        }
        return result
    }

    /// A sampled intent with a `traceparent` gives one span tree under it: the intent's span with
    /// its id, token hash (never the token), topic, status; the Redis policy, the APNs send (its
    /// status) and the outcome's publish under that; the outcome carries the intent span's
    /// context. An unsampled one and one without context give no span.
    @Test func aTracedIntentGivesItsSpanTree() async throws {
        let receiver = try await OTLPReceiver()
        let redis = try RedisServerProcess()
        let harness = try await RelayHarness.start(configureRelay: {
            $0.redis.url = redis.url
            $0.tracing.otlpEndpoint = receiver.url
        })
        let traceID = "4bf92f3577b34da6a3ce929d0e0e4736", parentID = "00f067aa0ba902b7"
        func send(_ id: String, token: Int, traceparent: String?) async throws {
            _ = try await harness.producer.send(
                topic: harness.intentsTopic, key: Array(hexToken(token).utf8), value: Array(intent(id, token: hexToken(token)).utf8),
                headers: traceparent.map { [KafkaHeader(name: "traceparent", value: Array($0.utf8))] } ?? [])
        }
        try await send("traced", token: 1, traceparent: "00-\(traceID)-\(parentID)-01")
        try await send("unsampled", token: 2, traceparent: "00-\(traceID)-\(parentID)-00")
        try await send("untraced", token: 3, traceparent: nil)
        let outcomes = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 3 }
        try await waitUntil(timeout: .seconds(20)) { receiver.spans.count >= 4 }

        let spans = receiver.spans
        #expect(spans.count == 4, "\(spans)")
        #expect(spans.allSatisfy { $0["traceId"] as? String == traceID })
        let intentSpan = try #require(spans.first { $0["name"] as? String == "apns-relay intent" })
        #expect(intentSpan["parentSpanId"] as? String == parentID)
        let intentSpanID = try #require(intentSpan["spanId"] as? String)
        let attributes = Self.attributes(intentSpan)
        #expect(attributes["apns_relay.intent.id"] == "traced")
        #expect(attributes["apns.topic"] == "com.example.app")
        #expect(attributes["apns_relay.outcome.status"] == "delivered")
        #expect(attributes["apns_relay.token.sha256"]?.count == 16)
        #expect(!"\(spans)".contains(hexToken(1)), "the device token must not reach a span")
        let children = spans.filter { $0["parentSpanId"] as? String == intentSpanID }
        #expect(Set(children.compactMap { $0["name"] as? String }) == ["redis policy", "apns send", "kafka publish outcome"])
        let send = try #require(children.first { $0["name"] as? String == "apns send" })
        #expect(Self.attributes(send)["apns.status"] == "200")
        for span in spans {
            let start = UInt64(span["startTimeUnixNano"] as? String ?? "") ?? 0
            let end = UInt64(span["endTimeUnixNano"] as? String ?? "") ?? 0
            #expect(start > 0 && start <= end, "\(span)")
        }

        // The outcome names the relay's span as its parent, in the same trace.
        let traced = try #require(outcomes.first { String(decoding: $0.value, as: UTF8.self).contains(#""id":"traced""#) })
        #expect(traced.header("traceparent")?.value == Array("00-\(traceID)-\(intentSpanID)-01".utf8))
        let unsampled = try #require(outcomes.first { String(decoding: $0.value, as: UTF8.self).contains(#""id":"unsampled""#) })
        #expect(unsampled.header("traceparent")?.value == Array("00-\(traceID)-\(parentID)-00".utf8))
        await harness.stop()
        await receiver.stop()
    }

    static func span(_ name: String) -> FinishedSpan {
        FinishedSpan(traceID: .random(), spanID: .random(), parentSpanID: nil, name: name, kind: .internal,
                     start: 1, end: 2, attributes: [])
    }

    /// A collector that is not there: each batch is tried three times, then dropped and counted;
    /// the exporter goes on and ends at a graceful shutdown. More than the capacity at once is
    /// dropped at once.
    @Test func spansNobodyTakesAreDroppedAndCounted() async throws {
        let endpoint = try #require(OTLPEndpoint("http://127.0.0.1:\(try freePort())"))
        let exporter = try SpanExporter(endpoint: endpoint, capacity: 4, logger: Logger(label: "test"))
        exporter.submit([Self.span("a"), Self.span("b"), Self.span("c")])
        exporter.submit([Self.span("d"), Self.span("e")])
        #expect(exporter.droppedSpans.load(ordering: .relaxed) == 2)
        let running = Task { try await exporter.run() }
        try await waitUntil(timeout: .seconds(20)) { exporter.droppedSpans.load(ordering: .relaxed) == 5 }
        running.cancel()
        try await running.value
    }

    @Test func endpointsParse() {
        #expect(OTLPEndpoint("http://collector:4318") == OTLPEndpoint(host: "collector", port: 4318, tls: false, path: "/v1/traces"))
        #expect(OTLPEndpoint("https://otel.example.com/prefix/")?.path == "/prefix/v1/traces")
        #expect(OTLPEndpoint("https://otel.example.com")?.port == 443)
        #expect(OTLPEndpoint("http://collector")?.port == 4318)
        for bad in ["", "collector:4318", "grpc://collector:4317", "http://", "http://c:4318?x=1"] {
            #expect(OTLPEndpoint(bad) == nil, "\(bad)")
        }
    }
}
