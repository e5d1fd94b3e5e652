import NIOCore
import NIOHTTP1
import NIOPosix

/// An OTLP/HTTP collector that takes every span and keeps none (`bench e2e --trace`): each
/// `POST` is answered 200 with an empty protobuf response, on keep-alive connections.
final class SpanSink: Sendable {
    private let channel: any Channel

    var url: String { "http://127.0.0.1:\(channel.localAddress?.port ?? 0)" }

    private init(channel: any Channel) {
        self.channel = channel
    }

    static func start() async throws -> SpanSink {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(Answer())
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return SpanSink(channel: channel)
    }

    func stop() async { try? await channel.close() }

    private final class Answer: ChannelInboundHandler, Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard case .end = unwrapInboundIn(data) else { return }
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: "application/x-protobuf")
            headers.add(name: "content-length", value: "0")
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }
}
