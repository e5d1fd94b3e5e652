import HTTP2
import NIOCore
import NIOPosix
import NIOSSL

/// One HTTP/2 connection with the project's engine, for sending requests the APNs client would
/// refuse to build (bad headers, wrong methods) straight at the simulator.
final class RawHTTP2Client: Sendable {
    private let channel: any Channel
    private let handler: NIOLoopBound<HTTP2ClientHandler>

    static func connect(port: Int, configuration: HTTP2ClientHandler.Configuration = .init(),
                        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> RawHTTP2Client {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.certificateVerification = .none
        tls.applicationProtocols = ["h2"]
        let context = try NIOSSLContext(configuration: tls)
        let loop = group.any()
        let ready = loop.makePromise(of: Void.self)
        let closed = loop.makePromise(of: HTTP2Error?.self)
        let bound = loop.makePromise(of: NIOLoopBound<HTTP2ClientHandler>.self)
        let channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let handler = HTTP2ClientHandler(configuration: configuration)
                    handler.onEvent = { event in
                        switch event {
                        case .ready: ready.succeed()
                        case .closed(let error):
                            ready.fail(error ?? HTTP2Error.closed("closed"))
                            closed.succeed(error)
                        default: break
                        }
                    }
                    bound.succeed(NIOLoopBound(handler, eventLoop: channel.eventLoop))
                    try channel.pipeline.syncOperations.addHandlers([
                        try NIOSSLClientHandler(context: context, serverHostname: nil), handler,
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        try await ready.futureResult.get()
        let handler = try await bound.futureResult.get()
        return RawHTTP2Client(channel: channel, handler: handler, closedEvent: closed.futureResult)
    }

    private let closedEvent: EventLoopFuture<HTTP2Error?>

    private init(channel: any Channel, handler: NIOLoopBound<HTTP2ClientHandler>, closedEvent: EventLoopFuture<HTTP2Error?>) {
        self.channel = channel
        self.handler = handler
        self.closedEvent = closedEvent
    }

    /// Waits for the connection to close; returns why.
    func closed() async throws -> HTTP2Error? {
        try await closedEvent.get()
    }

    func execute(_ request: HTTP2Request, timeout: TimeAmount = .seconds(5)) async throws -> HTTP2Response {
        let promise = channel.eventLoop.makePromise(of: HTTP2Response.self)
        let handler = handler
        channel.eventLoop.execute {
            handler.value.execute(request, deadline: .now() + timeout) { result in
                promise.completeWith(result.mapError { $0 as any Error })
            }
        }
        return try await promise.futureResult.get()
    }

    /// The request's result as the handler gives it, errors included.
    func result(_ request: HTTP2Request, timeout: TimeAmount) async -> Result<HTTP2Response, HTTP2StreamError> {
        let promise = channel.eventLoop.makePromise(of: Result<HTTP2Response, HTTP2StreamError>.self)
        let handler = handler
        channel.eventLoop.execute {
            handler.value.execute(request, deadline: .now() + timeout) { promise.succeed($0) }
        }
        return (try? await promise.futureResult.get()) ?? .failure(.connectionLost("channel gone"))
    }

    /// Requests waiting in the handler for a free stream.
    func pendingRequests() async -> Int {
        let handler = handler
        return (try? await channel.eventLoop.submit { handler.value.pendingRequests }.get()) ?? -1
    }

    func close() async {
        try? await channel.close()
    }
}
