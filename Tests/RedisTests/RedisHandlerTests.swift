import Common
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
@testable import Redis
import Testing

/// The Redis handler in an `EmbeddedChannel`: replies however they are split, error replies,
/// a connection that closes on waiting commands, and a reply nobody asked for.
@Suite("Redis handler, byte by byte", .timeLimit(.minutes(1)))
struct RedisHandlerTests {
    /// A channel with the handler, and a batch of `commands` written to it (its replies' future).
    static func write(_ commands: [RedisCommand], to channel: EmbeddedChannel) -> EventLoopFuture<[RESPValue]> {
        let promise = channel.eventLoop.makePromise(of: [RESPValue].self)
        channel.write(RedisBatch(commands: RedisCommandBuffer(commands), promise: promise), promise: nil)
        channel.flush()
        return promise.futureResult
    }

    static func feed(_ channel: EmbeddedChannel, _ text: String) throws {
        try channel.writeInbound(channel.allocator.buffer(string: text))
    }

    /// The future's result if it is complete (an embedded channel completes them in line).
    static func result(_ future: EventLoopFuture<[RESPValue]>) -> Result<[RESPValue], any Error>? {
        let result = NIOLockedValueBox<Result<[RESPValue], any Error>?>(nil)
        future.whenComplete { completed in result.withLockedValue { $0 = completed } }
        return result.withLockedValue { $0 }
    }

    @Test func repliesSplitAnywhereCompleteTheirBatchesOnceAndInOrder() throws {
        let channel = EmbeddedChannel(handler: RedisHandler())
        let first = Self.write([RedisCommand("SET", ["k", "v"]), RedisCommand("GET", ["k"])], to: channel)
        let second = Self.write([RedisCommand("INCR", ["n"])], to: channel)
        let written = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(String(buffer: written).hasPrefix("*3\r\n$3\r\nSET\r\n"))
        // The first batch's two replies take 12 bytes, the second's 4; fed one byte at a time.
        let replies = Array("+OK\r\n$1\r\nv\r\n:7\r\n".utf8)
        let completions = NIOLockedValueBox(0)
        first.whenComplete { _ in completions.withLockedValue { $0 += 1 } }
        for (index, byte) in replies.enumerated() {
            try channel.writeInbound(channel.allocator.buffer(bytes: [byte]))
            #expect((Self.result(first) != nil) == (index >= 11), "after byte \(index)")
            #expect((Self.result(second) != nil) == (index == replies.count - 1), "after byte \(index)")
        }
        #expect(completions.withLockedValue { $0 } == 1)
        #expect(try Self.result(first)?.get() == [.status("OK"), .bulk(Array("v".utf8))])
        #expect(try Self.result(second)?.get() == [.integer(7)])
        _ = try channel.finish()
    }

    /// An error reply is a reply (the batch succeeds with it); the next batch goes on.
    @Test func anErrorReplyIsAnAnswerNotAFailure() throws {
        let channel = EmbeddedChannel(handler: RedisHandler())
        let batch = Self.write([RedisCommand("INCR", ["list"]), RedisCommand("PING")], to: channel)
        try Self.feed(channel, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n+PONG\r\n")
        #expect(try Self.result(batch)?.get() == [.error("WRONGTYPE Operation against a key holding the wrong kind of value"), .status("PONG")])
        let next = Self.write([RedisCommand("PING")], to: channel)
        try Self.feed(channel, "+PONG\r\n")
        #expect(try Self.result(next)?.get() == [.status("PONG")])
        _ = try channel.finish()
    }

    /// The connection closes with commands outstanding: they fail as a lost connection (Redis
    /// may have run them), and so does every later write.
    @Test func aClosedConnectionFailsWhatWaitsAndWhatComes() throws {
        let channel = EmbeddedChannel(handler: RedisHandler())
        let waiting = Self.write([RedisCommand("SET", ["k", "v"]), RedisCommand("GET", ["k"])], to: channel)
        try Self.feed(channel, "+OK\r\n")
        #expect(Self.result(waiting) == nil, "half answered: still waiting")
        channel.pipeline.fireChannelInactive()
        #expect(throws: RedisError.connectionLost("connection closed")) { try Self.result(waiting)?.get() }
        let later = Self.write([RedisCommand("PING")], to: channel)
        #expect(throws: RedisError.connectionLost("connection closed")) { try Self.result(later)?.get() }
        _ = try channel.finish()
    }

    /// A batch written to a connection already closed fails at once as never sent, instead of
    /// waiting for a reply that cannot come: a socket's pipeline loses its handlers when it
    /// closes, so the write reaches no handler to fail the batch (a real socket: an embedded
    /// channel keeps its handlers and takes writes after it closed).
    @Test func aBatchForAClosedConnectionFailsAsNeverSent() async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { $0.eventLoop.makeSucceededVoidFuture() }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(server.localAddress?.port)
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { $0.pipeline.addHandler(RedisHandler()) }
            .connect(host: "127.0.0.1", port: port).get()
        try await channel.close()
        let replies = channel.eventLoop.flatSubmit {
            RedisSlot.send(RedisCommandBuffer([RedisCommand("PING")]), on: channel, handler: RedisHandler(),
                           deadline: .now() + .seconds(60))
        }
        let answer = AsyncWatched<Result<[RESPValue], any Error>?>(nil)
        replies.whenComplete { result in answer.update { $0 = result } }
        // Far inside the batch's 60 s deadline.
        #expect(await answer.wait(atMost: .seconds(10)) { $0 != nil }, "still waiting")
        var failed: RedisError?
        if case .failure(let error as RedisError)? = answer.value { failed = error }
        #expect(failed == .unavailable("connection closed before the commands were written"))
        try await server.close()
    }

    /// A reply with no command waiting: the stream cannot be trusted any more, so the
    /// connection closes and every later write fails as a protocol error.
    @Test func aReplyNobodyAskedForClosesTheConnection() throws {
        let channel = EmbeddedChannel(handler: RedisHandler())
        let asked = Self.write([RedisCommand("PING")], to: channel)
        try Self.feed(channel, "+OK\r\n+SURPRISE\r\n")
        #expect(try Self.result(asked)?.get() == [.status("OK")])
        #expect(!channel.isActive, "the connection was closed")
        Self.expectProtocolError(Self.result(Self.write([RedisCommand("PING")], to: channel)))
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    /// Bytes that are no reply fail what waits (and what comes) as a protocol error.
    @Test func anUnreadableReplyFailsWhatWaits() throws {
        let channel = EmbeddedChannel(handler: RedisHandler())
        let asked = Self.write([RedisCommand("PING")], to: channel)
        let waiting = Self.write([RedisCommand("PING")], to: channel)
        try Self.feed(channel, "+OK\r\n?garbage\r\n")
        #expect(try Self.result(asked)?.get() == [.status("OK")])
        Self.expectProtocolError(Self.result(waiting))
        #expect(!channel.isActive, "the connection was closed")
        Self.expectProtocolError(Self.result(Self.write([RedisCommand("PING")], to: channel)))
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    static func expectProtocolError(_ result: Result<[RESPValue], any Error>?, sourceLocation: SourceLocation = #_sourceLocation) {
        guard case .failure(let error as RedisError)? = result, case .protocolError = error else {
            Issue.record("expected a protocol error, got \(String(describing: result))", sourceLocation: sourceLocation)
            return
        }
    }
}
