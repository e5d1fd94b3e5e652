import Common
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// One pooled connection; its state lives on its event loop. `@unchecked Sendable`: `state`,
/// `failures` and `connectedTo` are touched only on `eventLoop` (the entry points hop there,
/// the helpers assert it); `isConnected` is the atomic other threads read.
final class RedisSlot: @unchecked Sendable {
    let eventLoop: any EventLoop
    let isConnected = Atomic<Bool>(false)
    private let configuration: RedisConfiguration
    private let sslContext: NIOSSLContext?
    private let logger: Logger
    /// Sentinel mode: where the master is now, asked at every connect (nil: `url`'s host and
    /// port). Such a connection checks `ROLE` at connect and closes on a `READONLY` reply, so
    /// that after a failover the next call connects to the new master.
    private let masterAddress: (@Sendable (NIODeadline, any EventLoop) -> EventLoopFuture<RedisNodeAddress>)?

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
    /// Sentinel mode: the master the open connection goes to.
    private var connectedTo: RedisNodeAddress?

    init(eventLoop: any EventLoop, configuration: RedisConfiguration, sslContext: NIOSSLContext?, logger: Logger,
         masterAddress: (@Sendable (NIODeadline, any EventLoop) -> EventLoopFuture<RedisNodeAddress>)? = nil) {
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.sslContext = sslContext
        self.logger = logger
        self.masterAddress = masterAddress
    }

    func execute(_ commands: RedisCommandBuffer, deadline: NIODeadline) -> EventLoopFuture<[RESPValue]> {
        eventLoop.flatSubmit {
            self.connection(deadline: deadline).flatMap { channel, handler in
                let replies = Self.send(commands, on: channel, handler: handler, deadline: deadline)
                guard self.masterAddress != nil else { return replies }
                return replies.map { replies in
                    // A master a failover made a replica: the next call connects to the new one.
                    if replies.contains(where: Self.isReadOnly) {
                        self.logger.warning("the Redis master became a replica: connecting to the one the Sentinels name",
                                            metadata: ["redis.url": "\(self.configuration.url)"])
                        channel.close(promise: nil)
                    }
                    return replies
                }
            }
        }
    }

    private static func isReadOnly(_ reply: RESPValue) -> Bool {
        guard case .error(let message) = reply else { return false }
        return RedisError.code(of: message) == "READONLY"
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

    /// Opens the socket (TLS for rediss), then AUTH and SELECT as one round trip (and, in
    /// Sentinel mode, to the master the Sentinels name, checked with `ROLE`).
    private func connect(deadline: NIODeadline) -> EventLoopFuture<(any Channel, RedisHandler)> {
        eventLoop.assertInEventLoop()
        guard let masterAddress else {
            return connect(host: configuration.url.host, port: configuration.url.port, deadline: deadline)
        }
        return masterAddress(deadline, eventLoop).hop(to: eventLoop).flatMap { address in
            self.connect(host: address.host, port: address.port, deadline: deadline).map { connected in
                self.connectedTo = address
                return connected
            }
        }
    }

    /// Sentinel mode: closes the open connection if it goes to another server than `master`
    /// (the Sentinels switched masters: the old one may take writes until it is made a replica),
    /// so that the next call connects to the new one.
    func leave(unless master: RedisNodeAddress) {
        eventLoop.execute {
            guard case .ready(let channel, _) = self.state, let connectedTo = self.connectedTo, connectedTo != master else { return }
            self.logger.warning("the Sentinels name another Redis master: connecting to it",
                                metadata: ["redis.master": "\(master)", "redis.previous_master": "\(connectedTo)"])
            channel.close(promise: nil)
        }
    }

    private func connect(host: String, port: Int, deadline: NIODeadline) -> EventLoopFuture<(any Channel, RedisHandler)> {
        eventLoop.assertInEventLoop()
        let sslContext = self.sslContext
        let connectTimeout = TimeAmount.nanoseconds(configuration.connectTimeout.totalNanoseconds)
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(min(connectTimeout, max(deadline - .now(), .milliseconds(1))))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: TLSServerName.of(host: host))
                        try channel.pipeline.syncOperations.addHandler(tls)
                    }
                    try channel.pipeline.syncOperations.addHandler(RedisHandler())
                }
            }
        return bootstrap.connect(host: host, port: port)
            .flatMapErrorThrowing { error in throw RedisError.unavailable("cannot connect to \(host):\(port): \(error)") }
            .flatMap { channel in
                channel.pipeline.handler(type: RedisHandler.self).flatMap { handler in
                    self.handshake(channel, handler, address: "\(host):\(port)", deadline: deadline).map { (channel, handler) }
                }
            }
    }

    private func handshake(_ channel: any Channel, _ handler: RedisHandler, address: String, deadline: NIODeadline) -> EventLoopFuture<Void> {
        eventLoop.assertInEventLoop()
        let url = configuration.url
        var commands: [RedisCommand] = []
        if let password = url.password {
            commands.append(RedisCommand("AUTH", (url.username.map { [$0] } ?? []) + [password]))
        }
        if url.database != 0 {
            commands.append(RedisCommand("SELECT", [url.database]))
        }
        let checksRole = masterAddress != nil
        if checksRole { commands.append(RedisCommand("ROLE", [])) }
        guard !commands.isEmpty else { return eventLoop.makeSucceededVoidFuture() }
        return Self.send(RedisCommandBuffer(commands), on: channel, handler: handler, deadline: deadline).flatMapThrowing { replies in
            for reply in replies {
                // The reply never echoes the password.
                if case .error(let message) = reply { throw RedisError.unavailable(message) }
            }
            // The Sentinels' answer can be late for a failover under way: only a master is taken.
            if checksRole, case .array(let role)? = replies.last, role.first?.string != "master" {
                throw RedisError.unavailable("\(address), named master by the Sentinels, is a \(role.first?.string ?? "?") now")
            }
        }.flatMapError { error in
            channel.close(promise: nil)
            return self.eventLoop.makeFailedFuture(error)
        }
    }
}
