import Foundation
import Kafka
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
@testable import Relay
import RedisTesting
import Common
import TestSupport
import Testing
import W3CTraceContext

/// An OTLP/HTTP collector in this process: every `POST /v1/traces`, answered 200 with an empty
/// `ExportTraceServiceResponse`.
final class OTLPReceiver: Sendable {
    struct Request: Sendable {
        var contentType: String
        var body: [UInt8]
    }

    /// What the connections' handlers share.
    final class Store: Sendable {
        /// The requests, as received (parsed when read).
        let received = Locked<[Request]>([])

        func take(_ path: String, _ request: Request) -> Int {
            guard path == "/v1/traces" else { return 404 }
            received.withLock { $0.append(request) }
            return 200
        }
    }

    private let channel: any Channel
    private let store = Store()

    var url: String { "http://127.0.0.1:\(channel.localAddress!.port!)" }

    var requests: [Request] { store.received.withLock { $0 } }

    /// A JSON span's attributes, their values as text.
    static func attributes(_ span: [String: Any]) -> [String: String] {
        var result: [String: String] = [:]
        for attribute in span["attributes"] as? [[String: Any]] ?? [] {
            guard let key = attribute["key"] as? String, let value = attribute["value"] as? [String: Any] else { continue }
            result[key] = (value["stringValue"] as? String) ?? (value["intValue"] as? String)
        }
        return result
    }

    /// Every span received so far, decoded as a collector decodes OTLP/HTTP's binary protobuf
    /// encoding (`opentelemetry/proto/collector/trace/v1`, field numbers from the proto files),
    /// in the shape of OTLP/JSON: ids in lower-case hex, times and integers as decimal strings.
    /// A body that is not valid protobuf of that shape fails the test.
    var spans: [[String: Any]] {
        requests.flatMap { request -> [[String: Any]] in
            guard request.contentType == "application/x-protobuf" else {
                Issue.record("a request in \(request.contentType), not OTLP's binary protobuf")
                return []
            }
            do {
                // ExportTraceServiceRequest.resource_spans = 1; ResourceSpans.scope_spans = 2;
                // ScopeSpans.spans = 2.
                return try ProtobufFields.messages(1, in: request.body).flatMap { resource in
                    try ProtobufFields.messages(2, in: resource).flatMap { scope in
                        try ProtobufFields.messages(2, in: scope).map(Self.span)
                    }
                }
            } catch {
                Issue.record("an export that is not OTLP protobuf: \(error)")
                return []
            }
        }
    }

    /// A `Span` message: trace_id 1, span_id 2, parent_span_id 4, name 5, start 7 and end 8
    /// (fixed64), attributes 9 (`KeyValue`: key 1, value 2, an `AnyValue`: string 1, int 3).
    static func span(_ bytes: [UInt8]) throws -> [String: Any] {
        var span: [String: Any] = [:]
        for field in try ProtobufFields.parse(bytes) {
            switch (field.number, field.value) {
            case (1, .bytes(let id)): span["traceId"] = hex(id)
            case (2, .bytes(let id)): span["spanId"] = hex(id)
            case (4, .bytes(let id)): if !id.isEmpty { span["parentSpanId"] = hex(id) }
            case (5, .bytes(let name)): span["name"] = String(decoding: name, as: UTF8.self)
            case (7, .fixed64(let time)): span["startTimeUnixNano"] = "\(time)"
            case (8, .fixed64(let time)): span["endTimeUnixNano"] = "\(time)"
            case (9, .bytes(let keyValue)):
                var key = "", value: [String: Any] = [:]
                for part in try ProtobufFields.parse(keyValue) {
                    switch (part.number, part.value) {
                    case (1, .bytes(let text)): key = String(decoding: text, as: UTF8.self)
                    case (2, .bytes(let any)):
                        for choice in try ProtobufFields.parse(any) {
                            switch (choice.number, choice.value) {
                            case (1, .bytes(let text)): value["stringValue"] = String(decoding: text, as: UTF8.self)
                            case (3, .varint(let number)): value["intValue"] = "\(Int64(bitPattern: number))"
                            default: break
                            }
                        }
                    default: break
                    }
                }
                span["attributes", default: [[String: Any]]()] = (span["attributes"] as? [[String: Any]] ?? []) + [["key": key, "value": value]]
            default: break
            }
        }
        return span
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

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

    /// One HTTP request's parts, gathered.
    /// `@unchecked Sendable`: a channel handler, used only on its channel's event loop.
    private final class Collector: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let store: Store
        var path = ""
        var contentType = ""
        var body: [UInt8] = []

        init(_ store: Store) { self.store = store }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                path = head.uri
                contentType = head.headers.first(name: "content-type") ?? ""
                body = []
            case .body(var buffer):
                body += buffer.readBytes(length: buffer.readableBytes) ?? []
            case .end:
                let status = store.take(path, Request(contentType: contentType, body: body))
                // An empty ExportTraceServiceResponse.
                var headers = HTTPHeaders()
                headers.add(name: "content-type", value: "application/x-protobuf")
                headers.add(name: "content-length", value: "0")
                context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: status),
                                                                     headers: headers))), promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            }
        }
    }
}

@Suite("Spans to an OTLP/HTTP collector", .stopsItsRelays, .timeLimit(.minutes(2)), .enabled(if: RelayTracing.isBuiltIn, "built without OTLPExport"))
struct SpanExportTests {
    static func attributes(_ span: [String: Any]) -> [String: String] { OTLPReceiver.attributes(span) }

    /// A sampled intent with a `traceparent` gives one span tree under it: the intent's span with
    /// its id, token hash (never the token), topic, status; the Redis policy, the APNs send (its
    /// status) and the outcome's publish under that; the outcome carries the intent span's
    /// context. An unsampled one and one without context give no span.
    @Test func aTracedIntentGivesItsSpanTree() async throws {
        let receiver = try await OTLPReceiver()
        let redis = try await RedisServerProcess.started()
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
        try await harness.stopExpectingOneOutcomeEach()
        await receiver.stop()
    }

    /// By default spans go out as OTLP's protobuf: one traced intent's request carries its
    /// trace id, span names and intent id.
    @Test func spansGoOutAsProtobufByDefault() async throws {
        let receiver = try await OTLPReceiver()
        let harness = try await RelayHarness.start(configureRelay: { $0.tracing.otlpEndpoint = receiver.url })
        #expect(harness.configuration.tracing.otlpProtocol == .httpProtobuf)
        let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
        _ = try await harness.producer.send(
            topic: harness.intentsTopic, key: Array(hexToken(1).utf8), value: Array(intent("proto-traced", token: hexToken(1)).utf8),
            headers: [KafkaHeader(name: "traceparent", value: Array("00-\(traceID)-00f067aa0ba902b7-01".utf8))])
        _ = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 1 }
        // Its spans may come in more than one request.
        try await waitUntil(timeout: .seconds(20)) { Self.contains(receiver.requests.flatMap(\.body), Array("kafka publish outcome".utf8)) }
        #expect(receiver.requests.allSatisfy { $0.contentType == "application/x-protobuf" })
        let request = OTLPReceiver.Request(contentType: "application/x-protobuf", body: receiver.requests.flatMap(\.body))
        let traceBytes = stride(from: 0, to: traceID.count, by: 2).map {
            UInt8(traceID.dropFirst($0).prefix(2), radix: 16)!
        }
        for needle in [traceBytes, Array("apns-relay intent".utf8), Array("apns send".utf8), Array("proto-traced".utf8)] {
            #expect(Self.contains(request.body, needle), "\(needle)")
        }
        #expect(!Self.contains(request.body, Array(hexToken(1).utf8)), "the device token must not reach a span")
        try await harness.stopExpectingOneOutcomeEach()
        await receiver.stop()
    }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count else { return false }
        return (0...(haystack.count - needle.count)).contains { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
    }

    /// A collector that is not there costs the relay nothing it must not lose: the traced
    /// intent's outcome goes out, and the relay stops within the export's 5 s deadline.
    @Test func anAbsentCollectorNeitherStopsNorHoldsTheRelay() async throws {
        let absent = try await freePort()
        let harness = try await RelayHarness.start(configureRelay: { $0.tracing.otlpEndpoint = "http://127.0.0.1:\(absent)" })
        _ = try await harness.producer.send(
            topic: harness.intentsTopic, key: Array(hexToken(1).utf8), value: Array(intent("lost-spans", token: hexToken(1)).utf8),
            headers: [KafkaHeader(name: "traceparent", value: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8))])
        let outcomes = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 1 }
        #expect(outcomes.count == 1)
        let stopping = ContinuousClock.now
        try await harness.stopExpectingOneOutcomeEach()
        let took = ContinuousClock.now - stopping
        #expect(took < .seconds(15), "stopping took \(took)")
    }

    /// The token's hash is the first 8 bytes of its SHA-256, in hex.
    @Test func theTokenHashIsSHA256sFirstEightBytes() {
        #expect(IntentTrace.tokenHash("abc") == "ba7816bf8f01cfea")
        #expect(IntentTrace.tokenHash("") == "e3b0c44298fc1c14")
    }

    @Test func endpointsParse() {
        #expect(OTLPEndpoint("http://collector:4318")?.url == "http://collector:4318/v1/traces")
        #expect(OTLPEndpoint("https://otel.example.com/prefix/")?.url == "https://otel.example.com/prefix/v1/traces")
        #expect(OTLPEndpoint("https://otel.example.com")?.port == 443)
        #expect(OTLPEndpoint("http://collector")?.port == 4318)
        for bad in ["", "collector:4318", "grpc://collector:4317", "http://", "http://c:4318?x=1", "http://c:4318#f"] {
            #expect(OTLPEndpoint(bad) == nil, "\(bad)")
        }
    }
}

@Suite("Tracing configuration", .stopsItsRelays, .timeLimit(.minutes(1)))
struct TracingConfigurationTests {
    /// Both keys read, written back by the redacted YAML, and their bad values refused by name.
    @Test func theTracingKeysAreReadAndChecked() throws {
        let configuration = try RelayConfiguration.load(
            yaml: "tracing:\n  otlp_endpoint: http://collector:4318\n  otlp_protocol: http/protobuf\n", environment: [:])
        #expect(configuration.tracing.otlpEndpoint == "http://collector:4318")
        #expect(configuration.tracing.otlpProtocol == .httpProtobuf)
        let again = try RelayConfiguration.load(yaml: configuration.redactedYAML, environment: [:])
        #expect(again.tracing.otlpEndpoint == "http://collector:4318" && again.tracing.otlpProtocol == .httpProtobuf)
        // OTLP/JSON with base64 ids is what the exporter would send: refused, with the reason.
        let json = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "tracing:\n  otlp_endpoint: http://collector:4318\n  otlp_protocol: http/json\n", environment: [:])
        }
        #expect(json.issues.count == 1 && json.issues[0].allowed.contains("hex"), "\(json)")
        #expect(try RelayConfiguration.load(yaml: "tracing: {}\n", environment: [:]).tracing.otlpProtocol == .httpProtobuf)
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "tracing:\n  otlp_endpoint: grpc://collector:4317\n  otlp_protocol: grpc\n", environment: [:])
        }
        #expect(Set(error.issues.map(\.key)) == ["tracing.otlp_endpoint", "tracing.otlp_protocol"], "\(error)")
    }

    /// OpenTelemetry variables that would break a promise, or that swift-otel cannot honour here
    /// (it stops the process on a baggage propagator or gRPC), are refused by name; the safe
    /// ones, and their harmless values, are not.
    @Test func environmentVariablesThatWouldBreakTracingAreRefused() {
        let refused = ["OTEL_PROPAGATORS": "tracecontext,baggage", "OTEL_TRACES_SAMPLER": "always_on",
                       "OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                       "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"]
        let problems = RelayTracing.environmentProblems(refused)
        #expect(problems.count == refused.count, "\(problems)")
        for name in refused.keys { #expect(problems.contains { $0.hasPrefix(name + "=") }, "\(name)") }
        let fine = ["OTEL_PROPAGATORS": "tracecontext", "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_TRACES_EXPORTER": "otlp",
                    "OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer x", "OTEL_SERVICE_NAME": "relay-eu"]
        #expect(RelayTracing.environmentProblems(fine).isEmpty)
        #expect(throws: (any Error).self) {
            _ = try RelayTracing(endpoint: "http://127.0.0.1:4318", protocol: .httpProtobuf, logger: Logger(label: "test"),
                                 environment: ["OTEL_PROPAGATORS": "baggage"])
        }
    }
}
