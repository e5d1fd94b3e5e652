public import Common
import Crypto
import Foundation
public import Logging
public import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

public struct RedisConfiguration: Sendable {
    public var url: RedisURL
    /// Connections in the pool; calls go round robin.
    public var connections: Int = 2
    /// Deadline for one call (or one pipelined batch), connecting included.
    public var commandTimeout: Duration = .seconds(2)
    public var connectTimeout: Duration = .seconds(2)
    /// After a failed connect, calls on that connection fail at once until the backoff passed.
    public var reconnectBackoff = Backoff(base: .milliseconds(100), maximum: .seconds(5))
    /// `rediss://` only: skip certificate verification (test servers only).
    public var tlsSkipVerify = false

    public init(url: RedisURL) {
        self.url = url
    }
}

/// Something that goes into a command as one RESP bulk string.
public protocol RESPArgument {
    /// Appends the argument's bytes.
    func appendRESP(to bytes: inout [UInt8])
}

extension String: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: utf8) } }
extension Substring: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: utf8) } }
extension Int: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { Int64(self).appendRESP(to: &bytes) } }
extension Int64: RESPArgument {
    /// Decimal digits, written in place (no string made).
    public func appendRESP(to bytes: inout [UInt8]) {
        if self < 0 { bytes.append(UInt8(ascii: "-")) }
        var magnitude = self.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { buffer in
            var start = buffer.count
            repeat {
                start -= 1
                buffer[start] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            bytes.append(contentsOf: buffer[start...])
        }
    }
}
extension Array: RESPArgument where Element == UInt8 { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: self) } }

/// One Redis command: its name and arguments, kept as one byte array and the arguments'
/// lengths. Hot paths build a command argument by argument into reserved room (no argument
/// array, no key strings): ``init(_:reservingBytes:arguments:)`` and the `append` methods.
public struct RedisCommand: Sendable, Equatable {
    /// Every argument's bytes, one after another (the command name first).
    var bytes: [UInt8]
    var lengths: [Int]

    public init(_ name: String, _ arguments: [any RESPArgument] = []) {
        self.init(name, reservingBytes: 16 * (arguments.count + 1), arguments: arguments.count)
        for argument in arguments { append(argument) }
    }

    /// An empty command named `name`, with room for `reservingBytes` bytes of arguments and
    /// `arguments` arguments.
    public init(_ name: String, reservingBytes: Int, arguments: Int) {
        bytes = []
        bytes.reserveCapacity(name.utf8.count + reservingBytes)
        lengths = []
        lengths.reserveCapacity(arguments + 1)
        append(name)
    }

    public mutating func append(_ argument: some RESPArgument) {
        appendArgument { argument.appendRESP(to: &$0) }
    }

    /// Empties the command (keeping its room) and names it `name`.
    mutating func reset(_ name: String) {
        bytes.removeAll(keepingCapacity: true)
        lengths.removeAll(keepingCapacity: true)
        append(name)
    }

    /// Appends one argument written in pieces by `write` (a key made of a prefix, a token and
    /// a topic, say), without an intermediate string.
    public mutating func appendArgument(_ write: (inout [UInt8]) -> Void) {
        let start = bytes.count
        write(&bytes)
        lengths.append(bytes.count - start)
    }

    /// `EVALSHA sha numkeys keys... arguments...`
    public static func evalsha(_ script: RedisScript, keys: [any RESPArgument], arguments: [any RESPArgument]) -> RedisCommand {
        var command = RedisCommand("EVALSHA", reservingBytes: 48 + 32 * (keys.count + arguments.count),
                                   arguments: 2 + keys.count + arguments.count)
        command.append(script.sha1)
        command.append(keys.count)
        for key in keys { command.append(key) }
        for argument in arguments { command.append(argument) }
        return command
    }
}

/// Commands encoded in RESP (hiredis' formatter) into one buffer as they are added, to be sent
/// in one round trip. Hot paths build each command in the buffer's reused scratch command
/// (``append(_:_:)``), so building allocates nothing once the room has grown.
public struct RedisCommandBuffer: Sendable {
    var bytes: ByteBuffer
    /// Commands encoded so far.
    public private(set) var count = 0
    private var scratch = RedisCommand("", reservingBytes: 256, arguments: 16)

    public init(reservingBytes: Int = 1024) {
        bytes = ByteBufferAllocator().buffer(capacity: reservingBytes)
    }

    public init(_ commands: [RedisCommand]) {
        self.init(reservingBytes: commands.reduce(0) { $0 + $1.bytes.count + 16 * $1.lengths.count })
        for command in commands { append(command) }
    }

    public var isEmpty: Bool { count == 0 }

    public mutating func append(_ command: RedisCommand) {
        RESPEncoder.encode(command, into: &bytes)
        count += 1
    }

    /// Builds a command named `name` with `build` and encodes it.
    public mutating func append(_ name: String, _ build: (inout RedisCommand) -> Void) {
        scratch.reset(name)
        build(&scratch)
        RESPEncoder.encode(scratch, into: &bytes)
        count += 1
    }
}

/// A Lua script, run with EVALSHA by its SHA-1 and loaded (SCRIPT LOAD) when Redis answers
/// NOSCRIPT — on first use and after Redis lost its script cache (restart, SCRIPT FLUSH).
public struct RedisScript: Sendable {
    public let source: String
    public let sha1: String

    public init(_ source: String) {
        self.source = source
        self.sha1 = Insecure.SHA1.hash(data: Array(source.utf8)).map { String(format: "%02x", $0) }.joined()
    }
}

/// A small pool of Redis connections driven by SwiftNIO, with hiredis as the RESP engine.
///
/// Every call has a deadline (``RedisConfiguration/commandTimeout``); a connection whose answer
/// is late is closed (the replies behind it would be out of step) and made again. A connection
/// that cannot be made fails calls at once until its backoff (with jitter) passed, so callers
/// learn quickly that Redis is down and decide themselves how to wait.
public final class RedisClient: Sendable {
    public let configuration: RedisConfiguration
    private let slots: [RedisSlot]
    private let group: any EventLoopGroup
    private let ownsGroup: Bool
    private let next = Atomic<Int>(0)
    private let isShutDown = Atomic<Bool>(false)

    public init(configuration: RedisConfiguration, eventLoopGroup: (any EventLoopGroup)? = nil,
                logger: Logger = Logger(label: "apns-relay.redis")) throws(RedisError) {
        guard configuration.connections >= 1 else { throw .invalidURL("connections must be at least 1") }
        self.configuration = configuration
        if let eventLoopGroup {
            group = eventLoopGroup
            ownsGroup = false
        } else {
            group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            ownsGroup = true
        }
        var sslContext: NIOSSLContext?
        if configuration.url.tls {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.minimumTLSVersion = .tlsv12
            if configuration.tlsSkipVerify { tls.certificateVerification = .none }
            do {
                sslContext = try NIOSSLContext(configuration: tls)
            } catch {
                throw .unavailable("cannot set up TLS: \(error)")
            }
        }
        let loops = Array(group.makeIterator())
        let context = sslContext
        slots = (0..<configuration.connections).map { index in
            RedisSlot(eventLoop: loops[index % loops.count], configuration: configuration, sslContext: context, logger: logger)
        }
    }

    /// Runs one command; an error reply throws ``RedisError/server(_:)``.
    public func send(_ command: RedisCommand) async throws(RedisError) -> RESPValue {
        let reply = try await pipeline([command])[0]
        if case .error(let message) = reply { throw .server(message) }
        return reply
    }

    /// Runs the commands in one round trip; their replies in order (error replies included as
    /// ``RESPValue/error(_:)``).
    public func pipeline(_ commands: [RedisCommand]) async throws(RedisError) -> [RESPValue] {
        try await pipeline(RedisCommandBuffer(commands))
    }

    /// Runs encoded commands in one round trip, like ``pipeline(_:)-([RedisCommand])``.
    public func pipeline(_ commands: RedisCommandBuffer) async throws(RedisError) -> [RESPValue] {
        try await execute(commands, on: slots[next.wrappingAdd(1, ordering: .relaxed).oldValue % slots.count]).get()
    }

    /// Writes the commands now, as one pipeline on the client's first connection, and returns
    /// their pending replies. Calls made one after another run in Redis in that order (one
    /// connection answers in order), so a caller can have several round trips under way whose
    /// effects must not be reordered.
    public func submit(_ commands: RedisCommandBuffer) -> RedisPendingReplies {
        execute(commands, on: slots[0])
    }

    private func execute(_ commands: RedisCommandBuffer, on slot: RedisSlot) -> RedisPendingReplies {
        guard !isShutDown.load(ordering: .relaxed) else {
            return RedisPendingReplies(future: slot.eventLoop.makeFailedFuture(RedisError.shutdown))
        }
        let deadline = NIODeadline.now() + .nanoseconds(configuration.commandTimeout.totalNanoseconds)
        return RedisPendingReplies(future: slot.execute(commands, deadline: deadline))
    }

    /// Runs a script with EVALSHA, loading it first when Redis does not have it.
    public func evaluate(_ script: RedisScript, keys: [any RESPArgument], arguments: [any RESPArgument]) async throws(RedisError) -> RESPValue {
        let reply = try await pipelineLoading([script], [RedisCommand.evalsha(script, keys: keys, arguments: arguments)])[0]
        if case .error(let message) = reply { throw .server(message) }
        return reply
    }

    /// Runs the commands in one round trip, like ``pipeline(_:)``; when Redis answers NOSCRIPT
    /// (its script cache is empty: first use, restart, SCRIPT FLUSH) it loads `scripts` and runs
    /// again only the commands that were refused (they did not run), in a second round trip.
    public func pipelineLoading(_ scripts: [RedisScript], _ commands: [RedisCommand]) async throws(RedisError) -> [RESPValue] {
        var replies = try await pipeline(commands)
        let refused = replies.indices.filter { index in
            if case .error(let message) = replies[index] { return message.hasPrefix("NOSCRIPT") }
            return false
        }
        guard !refused.isEmpty else { return replies }
        let again = try await pipeline(scripts.map { RedisCommand("SCRIPT", ["LOAD", $0.source]) } + refused.map { commands[$0] })
        for load in again.prefix(scripts.count) {
            if case .error(let message) = load { throw .server(message) }
        }
        for (index, reply) in zip(refused, again.dropFirst(scripts.count)) { replies[index] = reply }
        return replies
    }

    /// Connections that are open now.
    public var connectedCount: Int {
        slots.reduce(0) { $0 + ($1.isConnected.load(ordering: .relaxed) ? 1 : 0) }
    }

    public func shutdown() async {
        guard !isShutDown.exchange(true, ordering: .relaxed) else { return }
        for slot in slots {
            try? await slot.shutdown().get()
        }
        if ownsGroup {
            try? await group.shutdownGracefully()
        }
    }
}

/// The replies of a ``RedisClient/submit(_:)``, to be awaited.
public struct RedisPendingReplies: Sendable {
    let future: EventLoopFuture<[RESPValue]>

    public func get() async throws(RedisError) -> [RESPValue] {
        do {
            return try await future.get()
        } catch let error as RedisError {
            throw error
        } catch {
            throw .connectionLost("\(error)")
        }
    }
}

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
                let promise = self.eventLoop.makePromise(of: [RESPValue].self)
                let timeout = self.eventLoop.scheduleTask(deadline: deadline) {
                    // Replies behind a late one are out of step: fail what waits, start over.
                    handler.failAll(.timedOut)
                    channel.close(promise: nil)
                }
                promise.futureResult.whenComplete { _ in timeout.cancel() }
                channel.writeAndFlush(RedisBatch(commands: commands, promise: promise), promise: nil)
                return promise.futureResult
            }
        }
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
        let url = configuration.url
        let sslContext = self.sslContext
        let connectTimeout = TimeAmount.nanoseconds(configuration.connectTimeout.totalNanoseconds)
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(min(connectTimeout, max(deadline - .now(), .milliseconds(1))))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: url.host.first?.isNumber == true ? nil : url.host)
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
        let url = configuration.url
        var commands: [RedisCommand] = []
        if let password = url.password {
            commands.append(RedisCommand("AUTH", (url.username.map { [$0] } ?? []) + [password]))
        }
        if url.database != 0 {
            commands.append(RedisCommand("SELECT", [url.database]))
        }
        guard !commands.isEmpty else { return eventLoop.makeSucceededVoidFuture() }
        let promise = eventLoop.makePromise(of: [RESPValue].self)
        let timeout = eventLoop.scheduleTask(deadline: deadline) {
            handler.failAll(.timedOut)
            channel.close(promise: nil)
        }
        promise.futureResult.whenComplete { _ in timeout.cancel() }
        channel.writeAndFlush(RedisBatch(commands: RedisCommandBuffer(commands), promise: promise), promise: nil)
        return promise.futureResult.flatMapThrowing { replies in
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
