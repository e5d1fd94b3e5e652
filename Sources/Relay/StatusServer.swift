public import NIOCore
import NIOHTTP1
import NIOPosix
public import Prometheus

/// The relay's HTTP endpoints on `http.port`: `GET /metrics` (Prometheus text format),
/// `GET /healthz` (200 while the process runs), `GET /readyz` (200 when ready, else 503 with the
/// reason). Anything else is 404. Requests are small; bodies are ignored.
public final class StatusServer: Sendable {
    private let channel: any Channel
    public let port: Int

    /// - Parameter readiness: nil when ready, else why not.
    public static func start(host: String = "0.0.0.0", port: Int, registry: PrometheusCollectorRegistry,
                             readiness: @escaping @Sendable () -> String?,
                             group: (any EventLoopGroup)? = nil) async throws -> StatusServer {
        let channel = try await ServerBootstrap(group: group ?? MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(StatusHandler(registry: registry, readiness: readiness))
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
    private let readiness: @Sendable () -> String?
    private var path: String?
    private var keepAlive = false

    init(registry: PrometheusCollectorRegistry, readiness: @escaping @Sendable () -> String?) {
        self.registry = registry
        self.readiness = readiness
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
            return (.ok, "text/plain", ByteBuffer(string: "ok\n"))
        case "/readyz":
            if let reason = readiness() {
                return (.serviceUnavailable, "text/plain", ByteBuffer(string: "not ready: \(reason)\n"))
            }
            return (.ok, "text/plain", ByteBuffer(string: "ready\n"))
        default:
            return (.notFound, "text/plain", ByteBuffer(string: "not found\n"))
        }
    }
}
