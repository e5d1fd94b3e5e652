public import NIOCore
import NIOHTTP1
import NIOPosix
public import Prometheus

/// What the status endpoints report: nil when fine, else why not.
public protocol RelayStatus: Sendable {
    /// Why the process should be restarted (liveness), if it should.
    var notAliveReason: String? { get }
    /// Why it should get no traffic now (readiness), if it should not.
    var notReadyReason: String? { get }
    /// Settings that weaken it, shown by `/readyz` even when ready (TLS verification off).
    var warnings: [String] { get }
}

extension RelayStatus {
    public var warnings: [String] { [] }
}

/// The relay's HTTP endpoints on `http.port`: `GET /metrics` (Prometheus text format),
/// `GET /healthz` (200 while alive, else 503 with the reason), `GET /readyz` (200 when ready,
/// else 503 with the reason). Anything else is 404. Requests are small; bodies are ignored.
public final class StatusServer: Sendable {
    private let channel: any Channel
    public let port: Int

    public static func start(host: String = "0.0.0.0", port: Int, registry: PrometheusCollectorRegistry,
                             status: any RelayStatus,
                             group: (any EventLoopGroup)? = nil) async throws -> StatusServer {
        let channel = try await ServerBootstrap(group: group ?? MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(StatusHandler(registry: registry, status: status))
                }
            }
            .bind(host: host, port: port).get()
        return StatusServer(channel: channel, port: channel.localAddress?.port ?? port)
    }

    private init(channel: any Channel, port: Int) {
        self.channel = channel
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
    private var path: String?
    private var keepAlive = false

    init(registry: PrometheusCollectorRegistry, status: any RelayStatus) {
        self.registry = registry
        self.status = status
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            path = head.method == .GET ? String(head.uri.prefix { $0 != "?" }) : nil
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
            let warnings = status.warnings.map { "warning: \($0)\n" }.joined()
            if let reason = status.notReadyReason {
                return (.serviceUnavailable, "text/plain", ByteBuffer(string: "not ready: \(reason)\n" + warnings))
            }
            return (.ok, "text/plain", ByteBuffer(string: "ready\n" + warnings))
        default:
            return (.notFound, "text/plain", ByteBuffer(string: "not found\n"))
        }
    }
}
