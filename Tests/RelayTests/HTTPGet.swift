import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// `GET path` over plain HTTP/1.1 on loopback; returns the status code and the body.
func httpGet(port: Int, path: String) async throws -> (status: Int, body: String) {
    final class Collect: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let done: EventLoopPromise<String>
        let text = NIOLockedValueBox("")
        init(done: EventLoopPromise<String>) { self.done = done }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            let chunk = buffer.readString(length: buffer.readableBytes) ?? ""
            text.withLockedValue { $0 += chunk }
        }
        func channelInactive(context: ChannelHandlerContext) {
            done.succeed(text.withLockedValue { $0 })
        }
    }
    let loop = MultiThreadedEventLoopGroup.singleton.any()
    let done = loop.makePromise(of: String.self)
    let channel: any Channel
    do {
        channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Collect(done: done)) }
            }
            .connect(host: "127.0.0.1", port: port).get()
    } catch {
        // Nothing listens (yet): the promise must still be completed.
        done.fail(error)
        throw error
    }
    try await channel.writeAndFlush(ByteBuffer(string: "GET \(path) HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
    let response = try await done.futureResult.get()
    let status = Int(response.split(separator: " ").dropFirst().first ?? "") ?? 0
    let body = response.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
    return (status, body)
}

/// Whether Prometheus text holds `line` as a whole line when it names a value
/// (`name{labels} value`: a value of 2 does not match a series at 20); without a value (a name,
/// a label), whether any line holds it.
func hasMetricLine(_ body: String, _ line: String) -> Bool {
    body.split(separator: "\n").contains { line.contains(" ") ? $0 == line : $0.contains(line) }
}
