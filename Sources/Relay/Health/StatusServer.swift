public import NIOCore
import NIOHTTP1
import NIOPosix
public import Prometheus
import Synchronization

/// What the status endpoints report: nil when fine, else why not.
public protocol RelayStatus: Sendable {
    /// Why the process should be restarted (liveness), if it should.
    var notAliveReason: String? { get }
    /// Why it should get no traffic now (readiness), if it should not.
    var notReadyReason: String? { get }
    /// Settings that weaken it, shown by `/readyz` even when ready (TLS verification off).
    var warnings: [String] { get }
    /// What its dependencies lack now (Redis, APNs), shown by `/readyz?verbose`; readiness
    /// does not depend on them.
    var dependencyProblems: [String] { get }
}

extension RelayStatus {
    public var warnings: [String] { [] }
    public var dependencyProblems: [String] { [] }
}

/// The relay's HTTP endpoints on `http.address`:`http.port`: `GET /metrics` (Prometheus text
/// format), `GET /healthz` (200 while alive, else 503 with the reason), `GET /readyz` (200 when
/// ready, else 503 with the reason; `/readyz?verbose` adds one line per dependency problem, or
/// `dependencies: ok`, with the same status). Anything else is 404. Bodies are ignored.
///
/// Bounded: a connection must deliver a whole request head within ``Limits/requestTimeout`` of
/// its accept or of its previous answer, else it is closed (idle keep-alive connections and
/// slow-loris requests alike); at most ``Limits/maxConnections`` are open at once, more are
/// closed as they arrive; a request head is limited by NIO's HTTP parser (80 KB).
public final class StatusServer: Sendable {
    public struct Limits: Sendable {
        public var requestTimeout: Duration
        public var maxConnections: Int

        public init(requestTimeout: Duration = .seconds(10), maxConnections: Int = 4096) {
            self.requestTimeout = requestTimeout
            self.maxConnections = maxConnections
        }
    }

    private let channel: any Channel
    private let connections: OpenConnections
    public let port: Int

    /// Connections open now.
    public var openConnections: Int { connections.count.load(ordering: .relaxed) }

    /// Refused past ``Limits/maxConnections`` (the connection is closed).
    struct TooManyConnections: Error {}

    public static func start(host: String = "0.0.0.0", port: Int, registry: PrometheusCollectorRegistry,
                             status: any RelayStatus, limits: Limits = Limits(),
                             group: (any EventLoopGroup)? = nil) async throws -> StatusServer {
        let counter = OpenConnections()
        let channel = try await ServerBootstrap(group: group ?? MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                guard counter.open(limit: limits.maxConnections) else {
                    return channel.eventLoop.makeFailedFuture(TooManyConnections())
                }
                channel.closeFuture.whenComplete { _ in counter.closed() }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(
                        StatusHandler(registry: registry, status: status, requestTimeout: limits.requestTimeout))
                }
            }
            .bind(host: host, port: port).get()

        return StatusServer(channel: channel, connections: counter, port: channel.localAddress?.port ?? port)
    }

    /// Connections open now, against the limit.
    private final class OpenConnections: Sendable {
        let count = Atomic<Int>(0)

        /// Counts one more; false (and not counted) past `limit`.
        func open(limit: Int) -> Bool {
            if count.wrappingAdd(1, ordering: .relaxed).newValue > limit {
                count.wrappingSubtract(1, ordering: .relaxed)
                return false
            }
            return true
        }

        func closed() {
            count.wrappingSubtract(1, ordering: .relaxed)
        }
    }

    private init(channel: any Channel, connections: OpenConnections, port: Int) {
        self.channel = channel
        self.connections = connections
        self.port = port
    }

    public func stop() async {
        try? await channel.close()
    }
}

private final class StatusHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let registry: PrometheusCollectorRegistry
    private let status: any RelayStatus
    private let requestTimeout: Duration
    private var path: String?
    /// The query asks for `verbose` (`?verbose`, `?verbose=1`, `?verbose=true`).
    private var verbose = false
    private var keepAlive = false
    /// Closes the connection unless a request head arrives first.
    private var deadline: Scheduled<Void>?

    init(registry: PrometheusCollectorRegistry, status: any RelayStatus, requestTimeout: Duration) {
        self.registry = registry
        self.status = status
        self.requestTimeout = requestTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { awaitRequest(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        awaitRequest(context: context)
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }

    /// The next request head must arrive within the timeout.
    private func awaitRequest(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(requestTimeout)) {
            context.close(promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            deadline?.cancel()
            deadline = nil
            path = head.method == .GET ? String(head.uri.prefix { $0 != "?" }) : nil
            let query = head.uri.drop { $0 != "?" }.dropFirst()
            verbose = query.split(separator: "&").contains { ["verbose", "verbose=1", "verbose=true"].contains($0) }
            keepAlive = head.isKeepAlive
        case .body:
            break
        case .end:
            let (status, contentType, body) = answer()
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: contentType)
            headers.add(name: "content-length", value: String(body.readableBytes))
            if !keepAlive { headers.add(name: "connection", value: "close") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            let keepAlive = self.keepAlive
            context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
                if !keepAlive { context.close(promise: nil) }
            }
            if keepAlive { awaitRequest(context: context) }
        }
    }

    private func answer() -> (HTTPResponseStatus, String, ByteBuffer) {
        switch path {
        case "/metrics":
            return (.ok, "text/plain; version=0.0.4", ByteBuffer(bytes: registry.emitToBuffer()))
        case "/healthz":
            if let reason = status.notAliveReason {
                return (.serviceUnavailable, "text/plain", ByteBuffer(string: "not alive: \(reason)\n"))
            }
            return (.ok, "text/plain", ByteBuffer(string: "ok\n"))
        case "/readyz":
            var text = status.warnings.map { "warning: \($0)\n" }.joined()
            if verbose {
                let problems = status.dependencyProblems
                text += problems.isEmpty ? "dependencies: ok\n" : problems.map { "dependency: \($0)\n" }.joined()
            }
            if let reason = status.notReadyReason {
                return (.serviceUnavailable, "text/plain", ByteBuffer(string: "not ready: \(reason)\n" + text))
            }
            return (.ok, "text/plain", ByteBuffer(string: "ready\n" + text))
        default:
            return (.notFound, "text/plain", ByteBuffer(string: "not found\n"))
        }
    }
}
