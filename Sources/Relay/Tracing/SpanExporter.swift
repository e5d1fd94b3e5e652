import Common
import Foundation
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import ServiceLifecycle
import Synchronization
import W3CTraceContext

/// An OTLP/HTTP collector's address: `http(s)://HOST:PORT[/PREFIX]`; spans go to
/// `PREFIX/v1/traces`.
struct OTLPEndpoint: Sendable, Equatable {
    var host: String
    var port: Int
    var tls: Bool
    var path: String

    init(host: String, port: Int, tls: Bool, path: String) {
        self.host = host
        self.port = port
        self.tls = tls
        self.path = path
    }

    init?(_ text: String) {
        guard let url = URL(string: text), let scheme = url.scheme, ["http", "https"].contains(scheme),
              let host = url.host, !host.isEmpty, url.query == nil else { return nil }
        self.host = host
        self.tls = scheme == "https"
        self.port = url.port ?? (tls ? 443 : 4318)
        let prefix = url.path.hasSuffix("/") ? String(url.path.dropLast()) : url.path
        self.path = prefix + "/v1/traces"
    }
}

/// Sends finished spans to an OTLP/HTTP collector as JSON (`POST /v1/traces`,
/// `application/json`), every second, in batches of at most 512.
///
/// Bounded: at most `capacity` spans wait; more are dropped and counted
/// (`relay_trace_spans_dropped_total`), so a slow or absent collector costs memory it is allowed
/// and nothing else. A batch is tried three times (2 s to connect and 5 s for the answer each,
/// backoff with jitter between), then dropped and counted. On shutdown what waits gets one try,
/// within 2 s in all.
///
/// Hand-written rather than swift-otel's exporter: that brings gRPC, SwiftProtobuf and
/// AsyncHTTPClient, a first build of about 7 minutes on two cores, where the whole suite has a
/// 15-minute budget (docs/development.md).
final class SpanExporter: Service, Sendable {
    static let batchSize = 512
    let endpoint: OTLPEndpoint
    let capacity: Int
    private let waiting = Mutex<[FinishedSpan]>([])
    private let stopping = AsyncLatch()
    /// Made once: loading the trust store on each connection would block an event loop.
    private let tls: NIOSSLContext?
    private let logger: Logger
    static let dropped = Counter(label: "relay_trace_spans_dropped_total")
    /// Spans dropped by this exporter (the counter's share, for tests).
    let droppedSpans = Atomic<Int>(0)
    static let exported = Counter(label: "relay_trace_spans_exported_total")

    init(endpoint: OTLPEndpoint, capacity: Int = 8192, logger: Logger) throws {
        self.endpoint = endpoint
        self.tls = endpoint.tls ? try NIOSSLContext(configuration: .makeClientConfiguration()) : nil
        self.capacity = capacity
        self.logger = logger
        Self.dropped.increment(by: 0)
        Self.exported.increment(by: 0)
    }

    /// Queues spans for export; drops them (counted) when `capacity` already wait.
    func submit(_ spans: [FinishedSpan]) {
        let taken = waiting.withLock { waiting -> Bool in
            guard waiting.count + spans.count <= capacity else { return false }
            waiting += spans
            return true
        }
        if !taken { drop(spans.count) }
    }

    /// Exports what waits every second, in batches of ``batchSize``, until a graceful shutdown
    /// (then once more) or cancellation.
    func run() async throws {
        await withGracefulShutdownHandler {
            let backoff = Backoff(base: .milliseconds(200), maximum: .seconds(2))
            while true {
                let stop = await stopping.wait(atMost: .seconds(1))
                if stop || Task.isCancelled { break }
                while !Task.isCancelled, !stopping.isOpen, let batch = nextBatch() { await export(batch, tries: 3, backoff: backoff) }
            }
            // Stopping: what waits gets one try, within 2 s in all; the rest is dropped.
            let deadline = ContinuousClock.now + .seconds(2)
            while let batch = nextBatch() {
                if Task.isCancelled || ContinuousClock.now >= deadline {
                    drop(batch.count)
                } else {
                    await export(batch, tries: 1, backoff: backoff)
                }
            }
        } onGracefulShutdown: {
            self.stopping.open()
        }
    }

    private func nextBatch() -> [FinishedSpan]? {
        waiting.withLock { waiting in
            guard !waiting.isEmpty else { return nil }
            let batch = Array(waiting.prefix(Self.batchSize))
            waiting.removeFirst(batch.count)
            return batch
        }
    }

    private func export(_ batch: [FinishedSpan], tries: Int, backoff: Backoff) async {
        let body = Self.encode(batch)
        for attempt in 0..<tries {
            do {
                let status = try await post(body)
                if (200..<300).contains(status) {
                    Self.exported.increment(by: batch.count)
                    return
                }
                logger.warning("the trace collector refused spans", metadata: ["http.status": "\(status)"])
                // A client error will not change with a retry.
                if (400..<500).contains(status), status != 429 { break }
            } catch {
                logger.warning("cannot export spans", metadata: ["tracing.error": "\(error)"])
            }
            // A shutdown does not wait for retries.
            if attempt < tries - 1, !stopping.isOpen { try? await Task.sleep(for: backoff.delay(attempt: attempt)) } else { break }
        }
        drop(batch.count)
    }

    private func drop(_ count: Int) {
        Self.dropped.increment(by: count)
        droppedSpans.add(count, ordering: .relaxed)
    }

    /// One `POST` on a connection of its own; the response's status. Deadlines: 2 s to connect,
    /// then 5 s for the answer.
    private func post(_ body: [UInt8]) async throws -> Int {
        let endpoint = self.endpoint, tls = self.tls
        // No SNI for an address (NIOSSL refuses one).
        let hostname = (try? SocketAddress(ipAddress: endpoint.host, port: 0)) == nil ? endpoint.host : nil
        let answer = MultiThreadedEventLoopGroup.singleton.next().makePromise(of: Int.self)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(2))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: hostname))
                    }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(StatusCatcher(answer))
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            answer.fail(error)
            throw error
        }
        let timeout = channel.eventLoop.scheduleTask(in: .seconds(5)) {
            answer.fail(ChannelError.connectTimeout(.seconds(5)))
            channel.close(promise: nil)
        }
        defer {
            timeout.cancel()
            channel.close(promise: nil)
        }
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: endpoint.path)
        head.headers.add(name: "host", value: "\(endpoint.host):\(endpoint.port)")
        head.headers.add(name: "content-type", value: "application/json")
        head.headers.add(name: "content-length", value: "\(body.count)")
        head.headers.add(name: "connection", value: "close")
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil)
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        return try await answer.futureResult.get()
    }

    /// OTLP's JSON encoding of one `ExportTraceServiceRequest` (ids in hex, times as decimal
    /// strings, as the OTLP/HTTP JSON mapping asks).
    static func encode(_ spans: [FinishedSpan]) -> [UInt8] {
        var list: [UInt8] = [UInt8(ascii: "[")]
        for (index, span) in spans.enumerated() {
            if index > 0 { list.append(UInt8(ascii: ",")) }
            var object = JSONObjectWriter()
            object.add("traceId", "\(span.traceID)")
            object.add("spanId", "\(span.spanID)")
            if let parent = span.parentSpanID { object.add("parentSpanId", "\(parent)") }
            object.add(key: "name", span.name)
            object.add("kind", span.kind.rawValue)
            object.add("startTimeUnixNano", String(span.start))
            object.add("endTimeUnixNano", String(span.end))
            object.addJSON("attributes", attributes(span.attributes))
            object.addJSON("status", Array((span.failed ? #"{"code":2}"# : #"{"code":1}"#).utf8))
            list += object.finish()
        }
        list.append(UInt8(ascii: "]"))
        let resource = attributes([("service.name", .string("apns-relay"))])
        return Array(#"{"resourceSpans":[{"resource":{"attributes":"#.utf8) + resource
            + Array(#"},"scopeSpans":[{"scope":{"name":"apns-relay"},"spans":"#.utf8) + list + Array("}]}]}".utf8)
    }

    private static func attributes(_ attributes: [(String, FinishedSpan.Attribute)]) -> [UInt8] {
        var list: [UInt8] = [UInt8(ascii: "[")]
        for (index, (key, value)) in attributes.enumerated() {
            if index > 0 { list.append(UInt8(ascii: ",")) }
            var object = JSONObjectWriter()
            object.add(key: "key", key)
            switch value {
            case .string(let text): object.addJSON("value", Array(#"{"stringValue":\#(JSONObjectWriter.quote(text))}"#.utf8))
            case .int(let number): object.addJSON("value", Array(#"{"intValue":"\#(number)"}"#.utf8))
            }
            list += object.finish()
        }
        list.append(UInt8(ascii: "]"))
        return list
    }
}

/// Completes `answer` with the response's status code once its head arrives.
private final class StatusCatcher: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPClientResponsePart
    private let answer: EventLoopPromise<Int>

    init(_ answer: EventLoopPromise<Int>) {
        self.answer = answer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) { answer.succeed(Int(head.status.code)) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        answer.fail(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        answer.fail(error)
        context.close(promise: nil)
    }
}
