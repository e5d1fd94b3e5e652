import NIOCore

/// Commands written together, answered together: one round trip.
struct RedisBatch {
    var commands: RedisCommandBuffer
    var promise: EventLoopPromise<[RESPValue]>
}

/// Drives one Redis connection: batches of commands go out RESP-encoded (``RESPEncoder``),
/// replies come back through hiredis' reader and complete the batches in order (Redis answers
/// in order, which is what makes pipelining work). `@unchecked Sendable`: used only on its
/// channel's event loop; its handler methods assert it (debug builds, which the tests use), and
/// ``failAll(_:)``'s caller, a batch's timeout, runs there too.
final class RedisHandler: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = RedisBatch
    typealias OutboundOut = ByteBuffer

    private struct Pending {
        var count: Int
        var promise: EventLoopPromise<[RESPValue]>
    }

    private let decoder = RESPDecoder()
    private var pending = CircularBuffer<Pending>()
    /// The replies so far to the oldest pending batch (kept apart from `pending`, so that
    /// appending never copies them).
    private var collected: [RESPValue] = []
    private var failure: RedisError?

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        context.eventLoop.assertInEventLoop()
        let batch = unwrapOutboundIn(data)
        if let failure {
            batch.promise.fail(failure)
            promise?.fail(failure)
            return
        }
        guard !batch.commands.isEmpty else {
            batch.promise.succeed([])
            promise?.succeed(())
            return
        }
        pending.append(Pending(count: batch.commands.count, promise: batch.promise))
        context.write(wrapOutboundOut(batch.commands.bytes), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.eventLoop.assertInEventLoop()
        do {
            try decoder.feed(unwrapInboundIn(data))
            while let reply = try decoder.next() {
                guard let oldest = pending.first else {
                    throw RESPDecoder.ProtocolError(description: "a reply nobody asked for")
                }
                if collected.isEmpty { collected.reserveCapacity(oldest.count) }
                collected.append(reply)
                if collected.count == oldest.count {
                    pending.removeFirst()
                    let replies = collected
                    collected = []
                    oldest.promise.succeed(replies)
                }
            }
        } catch let error as RESPDecoder.ProtocolError {
            failAll(.protocolError(error.description))
            context.close(promise: nil)
        } catch {
            failAll(.protocolError("\(error)"))
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        context.eventLoop.assertInEventLoop()
        failAll(failure ?? .connectionLost("connection closed"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.eventLoop.assertInEventLoop()
        failAll(.connectionLost("\(error)"))
        context.close(promise: nil)
    }

    /// Fails every batch still waiting and every later write.
    func failAll(_ error: RedisError) {
        if failure == nil { failure = error }
        collected = []
        while let waiting = pending.popFirst() {
            waiting.promise.fail(error)
        }
    }
}
