import Common
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// One pooled connection; its state lives on its event loop.
final class RedisSlot: @unchecked Sendable {
    let eventLoop: any EventLoop
    let isConnected = Atomic<Bool>(false)
    private let configuration: RedisConfiguration
    private let sslContext: NIOSSLContext?
    private let logger: Logger

    private enum State {
        case idle
        case connecting(EventLoopFuture<(any Channel, RedisHandler)>)
        case ready(any Channel, RedisHandler)
        case coolingDown(until: NIODeadline, error: RedisError)
        case shutDown
    }

    // Confined to `eventLoop`.
    private var state = State.idle
    private var failures = 0

    init(eventLoop: any EventLoop, configuration: RedisConfiguration, sslContext: NIOSSLContext?, logger: Logger) {
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.sslContext = sslContext
        self.logger = logger
    }

    func execute(_ commands: RedisCommandBuffer, deadline: NIODeadline) -> EventLoopFuture<[RESPValue]> {
        eventLoop.flatSubmit {
            self.connection(deadline: deadline).flatMap { channel, handler in
                Self.send(commands, on: channel, handler: handler, deadline: deadline)
            }
        }
    }

    /// Writes a batch to a connection and returns its replies, failed at `deadline` (the
    /// connection is closed then: replies behind a late one are out of step). A batch the
    /// connection never took (closed before the write reached the handler) fails as
    /// `unavailable`: nothing of it was sent.
    static func send(_ commands: RedisCommandBuffer, on channel: any Channel, handler: RedisHandler,
                     deadline: NIODeadline) -> EventLoopFuture<[RESPValue]> {
        let loop = channel.eventLoop
        loop.assertInEventLoop()
        let promise = loop.makePromise(of: [RESPValue].self)
        let timeout = loop.scheduleTask(deadline: deadline) {
            handler.failAll(.timedOut)
            channel.close(promise: nil)
        }
        promise.futureResult.whenComplete { _ in timeout.cancel() }
        // The handler completes the batch (a failed write included); a write that never reached
        // it would leave the batch waiting forever.
        let written = loop.makePromise(of: Void.self)
        written.futureResult.whenFailure { error in
            if let error = error as? ChannelError, error == .ioOnClosedChannel {
                promise.fail(RedisError.unavailable("connection closed before the commands were written"))
            } else {
                promise.fail(error as? RedisError ?? .connectionLost("\(error)"))
            }
        }
        channel.writeAndFlush(RedisBatch(commands: commands, promise: promise), promise: written)
        return promise.futureResult
    }

    func shutdown() -> EventLoopFuture<Void> {
        eventLoop.flatSubmit {
            let previous = self.state
            self.state = .shutDown
            self.isConnected.store(false, ordering: .relaxed)
            switch previous {
            case .ready(let channel, _):
                return channel.close().recover { _ in }
            case .connecting(let future):
                return future.flatMap { channel, _ in channel.close() }.recover { _ in }
            default:
                return self.eventLoop.makeSucceededVoidFuture()
            }
        }
    }

    private func connection(deadline: NIODeadline) -> EventLoopFuture<(any Channel, RedisHandler)> {
        eventLoop.assertInEventLoop()
        switch state {
        case .ready(let channel, let handler) where channel.isActive:
            return eventLoop.makeSucceededFuture((channel, handler))
        case .connecting(let future):
            return future
        case .coolingDown(let until, let error) where NIODeadline.now() < until:
            return eventLoop.makeFailedFuture(error)
        case .shutDown:
            return eventLoop.makeFailedFuture(RedisError.shutdown)
        default:
            let future = connect(deadline: deadline)
            state = .connecting(future)
            future.whenComplete { result in
                guard case .connecting = self.state else { return }
                switch result {
                case .success(let (channel, handler)):
                    if self.failures > 0 {
                        self.logger.info("Redis connection made again", metadata: ["redis.url": "\(self.configuration.url)"])
                    }
                    self.failures = 0
                    self.state = .ready(channel, handler)
                    self.isConnected.store(true, ordering: .relaxed)
                    channel.closeFuture.whenComplete { _ in
                        self.isConnected.store(false, ordering: .relaxed)
                        if case .ready(let current, _) = self.state, current === channel { self.state = .idle }
                    }
                case .failure(let error):
                    let redisError = error as? RedisError ?? .unavailable("\(error)")
                    let wait = self.configuration.reconnectBackoff.delay(attempt: self.failures)
                    if self.failures == 0 {
                        self.logger.warning("cannot connect to Redis", metadata: [
                            "redis.url": "\(self.configuration.url)", "redis.error": "\(redisError)",
                        ])
                    }
                    self.failures += 1
                    self.state = .coolingDown(until: .now() + .nanoseconds(wait.totalNanoseconds), error: redisError)
                }
            }
            return future
        }
    }

    /// Opens the socket (TLS for rediss), then AUTH and SELECT as one round trip.
    private func connect(deadline: NIODeadline) -> EventLoopFuture<(any Channel, RedisHandler)> {
        eventLoop.assertInEventLoop()
        let url = configuration.url
        let sslContext = self.sslContext
        let connectTimeout = TimeAmount.nanoseconds(configuration.connectTimeout.totalNanoseconds)
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(min(connectTimeout, max(deadline - .now(), .milliseconds(1))))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: TLSServerName.of(host: url.host))
                        try channel.pipeline.syncOperations.addHandler(tls)
                    }
                    try channel.pipeline.syncOperations.addHandler(RedisHandler())
                }
            }
        return bootstrap.connect(host: url.host, port: url.port)
            .flatMapErrorThrowing { error in throw RedisError.unavailable("cannot connect to \(url.host):\(url.port): \(error)") }
            .flatMap { channel in
                channel.pipeline.handler(type: RedisHandler.self).flatMap { handler in
                    self.handshake(channel, handler, deadline: deadline).map { (channel, handler) }
                }
            }
    }

    private func handshake(_ channel: any Channel, _ handler: RedisHandler, deadline: NIODeadline) -> EventLoopFuture<Void> {
        eventLoop.assertInEventLoop()
        let url = configuration.url
        var commands: [RedisCommand] = []
        if let password = url.password {
            commands.append(RedisCommand("AUTH", (url.username.map { [$0] } ?? []) + [password]))
        }
        if url.database != 0 {
            commands.append(RedisCommand("SELECT", [url.database]))
        }
        guard !commands.isEmpty else { return eventLoop.makeSucceededVoidFuture() }
        return Self.send(RedisCommandBuffer(commands), on: channel, handler: handler, deadline: deadline).flatMapThrowing { replies in
            for reply in replies {
                // The reply never echoes the password.
                if case .error(let message) = reply { throw RedisError.unavailable(message) }
            }
        }.flatMapError { error in
            channel.close(promise: nil)
            return self.eventLoop.makeFailedFuture(error)
        }
    }
}
