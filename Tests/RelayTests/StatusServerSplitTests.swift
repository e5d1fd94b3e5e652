import NIOCore
import NIOPosix
@testable import Relay
import Common
import Testing

/// A request head that arrives in pieces is answered once it is whole.
@Suite("Status endpoints, requests in pieces", .timeLimit(.minutes(1)))
struct StatusServerSplitTests {
    /// Collects what the server sends; `head` completes once a whole response head arrived.
    final class Collector: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let received = Locked<[UInt8]>([])
        let head: EventLoopPromise<String>

        init(_ head: EventLoopPromise<String>) {
            self.head = head
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let bytes = Array(buffer: unwrapInboundIn(data))
            let text = received.withLock { received -> String in
                received += bytes
                return String(decoding: received, as: UTF8.self)
            }
            if text.contains("\r\n\r\n") { head.succeed(text) }
        }

        func channelInactive(context: ChannelHandlerContext) {
            head.fail(ChannelError.eof)
        }
    }

    @Test(arguments: [["GET /hea", "lthz HTTP/1.1\r\nHost: x\r\n\r\n"], ["GET /healthz HTTP/1.1\r\nHo", "st: x\r", "\n\r\n"]])
    func aHeadSplitAcrossReadsIsAnswered(pieces: [String]) async throws {
        let server = try await StatusServerTests.start(.init(requestTimeout: .seconds(10)))
        do {
            let answer = try await Self.ask(server.port, in: pieces)
            #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    /// Sends `pieces` one at a time on a new connection; the response head that comes back.
    static func ask(_ port: Int, in pieces: [String]) async throws -> String {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let head = loop.makePromise(of: String.self)
        let channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Collector(head)) }
            }
            .connect(host: "127.0.0.1", port: port).get()
        defer { channel.close(promise: nil) }
        for piece in pieces {
            try await channel.writeAndFlush(ByteBuffer(string: piece))
            // Nothing marks the server's read of a piece: a pause makes each a read of its own
            // (on a loaded machine two may still arrive together; the test then passes untested).
            try await Task.sleep(for: .milliseconds(150))
        }
        return try await head.futureResult.get()
    }
}
