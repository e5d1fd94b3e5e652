public import Common
import Foundation
public import Logging
public import Metrics
public import NIOCore
public import ServiceLifecycle
import NIOPosix
import NIOSSL
import Synchronization

public struct RedisConfiguration: Sendable {
    public enum Mode: String, Sendable, CaseIterable {
        /// One server (or a primary behind one address).
        case standalone
        /// A Redis Cluster: `url` names a seed node (database 0), calls are routed by hash slot.
        case cluster
        /// A master and its replicas watched by Redis Sentinel: `url` names one Sentinel (with
        /// ``RedisConfiguration/sentinels`` more) and the master's credentials, database and
        /// scheme; the connections go to the master the Sentinels name for
        /// ``RedisConfiguration/sentinelMaster``, again after a failover.
        case sentinel
    }

    public var url: RedisURL
    public var mode: Mode = .standalone
    /// Cluster mode: more seed nodes besides `url`'s, asked for the slot map when the known
    /// masters do not answer. Credentials and TLS are `url`'s for every node.
    public var clusterSeeds: [RedisNodeAddress] = []
    /// Sentinel mode: more Sentinels besides `url`'s.
    public var sentinels: [RedisNodeAddress] = []
    /// Sentinel mode: the name the Sentinels monitor the master under.
    public var sentinelMaster = "mymaster"
    /// Sentinel mode: the Sentinels' own password (`requirepass` in their configuration), nil
    /// when they ask none. `url`'s credentials are the master's.
    public var sentinelPassword: String?
    /// Sentinel mode: how often the Sentinels are asked whether the master changed (while the
    /// client runs as a service): connections to an old master close then.
    public var sentinelCheckInterval: Duration = .seconds(1)
    /// Cluster mode: redirect rounds (`MOVED`, `ASK`, `TRYAGAIN`...) a call follows at most.
    public var maxRedirects = 5
    /// Cluster mode: how often the slot map is read again when nothing said it changed.
    public var topologyRefreshInterval: Duration = .seconds(30)
    /// Connections in the pool (per node in cluster mode); calls go round robin.
    public var connections: Int = 2
    /// Deadline for one call (or one pipelined batch), connecting included.
    public var commandTimeout: Duration = .seconds(2)
    public var connectTimeout: Duration = .seconds(2)
    /// After a failed connect, calls on that connection fail at once until the backoff passed.
    public var reconnectBackoff = Backoff(base: .milliseconds(100), maximum: .seconds(5))
    /// `rediss://` only: skip certificate verification (test servers only).
    public var tlsSkipVerify = false
    /// `rediss://` only: PEM file of the certificate authorities the server's certificate is
    /// verified against (a private CA); nil: the system's.
    public var tlsCAFile: String?
    /// `rediss://` only: PEM files of a client certificate (its chain) and its key, for a Redis
    /// that asks clients for one (`tls-auth-clients yes`).
    public var tlsClientCertificate: (certificateFile: String, keyFile: String)?
    /// Where the per-node metrics go (cluster mode); nil: the process' `MetricsSystem`.
    public var metricsFactory: (any MetricsFactory)?

    public init(url: RedisURL) {
        self.url = url
    }
}

/// A small pool of Redis connections driven by SwiftNIO (commands written by ``RESPEncoder``,
/// replies read by hiredis' reader); in cluster mode a pool per master, calls routed by hash
/// slot (``RedisClusterRouter``).
///
/// Every call has a deadline (``RedisConfiguration/commandTimeout``); a connection whose answer
/// is late is closed (the replies behind it would be out of step) and made again. A connection
/// that cannot be made fails calls at once until its backoff (with jitter) passed, so callers
/// learn quickly that Redis is down and decide themselves how to wait.
///
/// Connections are made on first use, never in the initialiser. As a `Service`, the client
/// closes its connections when its service group shuts down gracefully.
public final class RedisClient: Service, Sendable {
    public let configuration: RedisConfiguration
    private let slots: [RedisSlot]
    private let cluster: RedisClusterRouter?
    private let sentinel: RedisSentinelResolver?
    private let group: any EventLoopGroup
    private let ownsGroup: Bool
    private let next = Atomic<Int>(0)
    private let isShutDown = Atomic<Bool>(false)
    private let shutDownLatch = AsyncLatch()

    public init(configuration: RedisConfiguration, eventLoopGroup: (any EventLoopGroup)? = nil,
                logger: Logger = Logger(label: "apns-relay.redis")) throws(RedisError) {
        guard configuration.connections >= 1 else { throw .invalidURL("connections must be at least 1") }
        if configuration.mode == .cluster, configuration.url.database != 0 {
            throw .invalidURL("a Redis Cluster has database 0 only, got \(configuration.url.database)")
        }
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
                if let ca = configuration.tlsCAFile { tls.trustRoots = .file(ca) }
                if let client = configuration.tlsClientCertificate {
                    tls.certificateChain = try NIOSSLCertificate.fromPEMFile(client.certificateFile).map { .certificate($0) }
                    tls.privateKey = .privateKey(try NIOSSLPrivateKey(file: client.keyFile, format: .pem))
                }
                sslContext = try NIOSSLContext(configuration: tls)
            } catch {
                throw .unavailable("cannot set up TLS: \(error)")
            }
        }
        let loops = Array(group.makeIterator())
        let context = sslContext
        switch configuration.mode {
        case .standalone:
            cluster = nil
            sentinel = nil
            slots = (0..<configuration.connections).map { index in
                RedisSlot(eventLoop: loops[index % loops.count], configuration: configuration, sslContext: context, logger: logger)
            }
        case .cluster:
            cluster = RedisClusterRouter(configuration: configuration, loops: loops, sslContext: context, logger: logger)
            sentinel = nil
            slots = []
        case .sentinel:
            guard !configuration.sentinelMaster.isEmpty else { throw .invalidURL("sentinel mode needs the master's name") }
            let resolver = RedisSentinelResolver(configuration: configuration, loops: loops, sslContext: context, logger: logger)
            cluster = nil
            sentinel = resolver
            slots = (0..<configuration.connections).map { index in
                RedisSlot(eventLoop: loops[index % loops.count], configuration: configuration, sslContext: context, logger: logger,
                          masterAddress: { deadline, loop in resolver.masterAddress(deadline: deadline, on: loop) })
            }
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
        try await submit(commands, ordered: false).get()
    }

    /// Writes the commands now, as one pipeline, and returns their pending replies: to be
    /// awaited, or heard on an event loop of the caller's (no task).
    ///
    /// `ordered`: on the client's first connection (to each node in cluster mode). Calls made
    /// one after another run in Redis in that order (one connection answers in order), so a
    /// caller can have several round trips under way whose effects must not be reordered. In
    /// cluster mode that holds per node, while the slot map stands: a redirected command is sent
    /// again after the calls behind it. Not `ordered`: on the next of the client's connections.
    public func submit(_ commands: RedisCommandBuffer, ordered: Bool) -> RedisPendingReplies {
        let deadline = NIODeadline.now() + .nanoseconds(configuration.commandTimeout.totalNanoseconds)
        guard !isShutDown.load(ordering: .relaxed) else {
            // Not on the client's own group, which may be shut down by now (its loops would drop
            // the callbacks): on the caller's loop, or NIO's shared group, never shut down.
            let loop = MultiThreadedEventLoopGroup.currentEventLoop ?? MultiThreadedEventLoopGroup.singleton.any()
            return RedisPendingReplies(future: loop.makeFailedFuture(RedisError.shutdown))
        }
        if let cluster {
            return RedisPendingReplies(future: cluster.execute(commands, deadline: deadline, ordered: ordered))
        }
        let slot = ordered ? slots[0] : slots[next.wrappingAdd(1, ordering: .relaxed).oldValue % slots.count]
        return RedisPendingReplies(future: slot.execute(commands, deadline: deadline))
    }

    /// Cluster mode: the masters of the slot map (read on first use, then kept up to date);
    /// Sentinel mode: the master the Sentinels named last (`url`'s Sentinel before they did);
    /// standalone: the server of `url`.
    public var nodes: [RedisNodeAddress] {
        cluster?.masters ?? [sentinel?.master ?? RedisNodeAddress(host: configuration.url.host, port: configuration.url.port)]
    }

    /// Runs keyless commands (`INFO`, `CONFIG GET`...) on every node (cluster mode: every
    /// master, the slot map read first), one round trip each, in parallel.
    public func onEveryNode(_ commands: [RedisCommand]) async throws(RedisError) -> [(node: RedisNodeAddress, replies: [RESPValue])] {
        guard let cluster else { return [(nodes[0], try await pipeline(commands))] }
        guard !isShutDown.load(ordering: .relaxed) else { throw .shutdown }
        let deadline = NIODeadline.now() + .nanoseconds(configuration.commandTimeout.totalNanoseconds)
        if cluster.masters.isEmpty, !(await cluster.refresh(deadline: deadline)) {
            throw .unavailable("cannot read the Redis Cluster's slot map")
        }
        return try await cluster.onEveryMaster(RedisCommandBuffer(commands), deadline: deadline).map { ($0.node.address, $0.replies) }
    }

    /// Cluster mode: reads the slot map again now (a test, or an operator's tool, that changed it).
    public func refreshTopology() async {
        await cluster?.refresh()
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
    ///
    /// `trailing` commands (a `WAIT` for the writes before it, say) follow the commands in the
    /// same pipeline, and follow the commands run again too; their replies come last, from
    /// the last round trip.
    public func pipelineLoading(_ scripts: [RedisScript], _ commands: [RedisCommand],
                                then trailing: [RedisCommand] = []) async throws(RedisError) -> [RESPValue] {
        var replies = try await pipeline(commands + trailing)
        let refused = commands.indices.filter { index in
            if case .error(let message) = replies[index] { return message.hasPrefix("NOSCRIPT") }
            return false
        }
        guard !refused.isEmpty else { return replies }
        let again = try await pipeline(scripts.map { RedisCommand("SCRIPT", ["LOAD", $0.source]) } + refused.map { commands[$0] } + trailing)
        for load in again.prefix(scripts.count) {
            if case .error(let message) = load { throw .server(message) }
        }
        for (index, reply) in zip(refused, again.dropFirst(scripts.count)) { replies[index] = reply }
        replies.replaceSubrange(commands.count..., with: again.suffix(trailing.count))
        return replies
    }

    /// Connections that are open now.
    public var connectedCount: Int {
        cluster?.connectedCount ?? slots.reduce(0) { $0 + ($1.isConnected.load(ordering: .relaxed) ? 1 : 0) }
    }

    /// Cluster mode: redirects followed and slot-map reads so far.
    public var clusterCounters: (moved: Int, ask: Int, refreshes: Int) {
        guard let cluster else { return (0, 0, 0) }
        return (cluster.movedRedirects.load(ordering: .relaxed), cluster.askRedirects.load(ordering: .relaxed),
                cluster.refreshes.load(ordering: .relaxed))
    }

    /// Waits for a graceful shutdown of the service group (or cancellation, or a direct
    /// ``shutdown()``), then shuts the client down.
    public func run() async {
        await withDiscardingTaskGroup { group in
            if let cluster {
                group.addTask { await cluster.refreshPeriodically() }
            }
            if sentinel != nil {
                group.addTask { await self.watchSentinels() }
            }
            await waitForGracefulShutdown(orUntil: shutDownLatch)
            group.cancelAll()
        }
        await shutdown()
    }

    /// Sentinel mode: asks the Sentinels every ``RedisConfiguration/sentinelCheckInterval``
    /// which server is the master, and closes the connections to any other (a master a failover
    /// replaced takes writes until the Sentinels make it a replica, which can take seconds).
    private func watchSentinels() async {
        guard let sentinel else { return }
        let loop = group.any()
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: configuration.sentinelCheckInterval)
            } catch {
                return
            }
            let deadline = NIODeadline.now() + .nanoseconds(configuration.commandTimeout.totalNanoseconds)
            guard let master = try? await sentinel.masterAddress(deadline: deadline, on: loop).get() else { continue }
            for slot in slots { slot.leave(unless: master) }
        }
    }

    /// Closes every connection; calls made afterwards fail. Later calls wait for the first.
    public func shutdown() async {
        guard !isShutDown.exchange(true, ordering: .relaxed) else {
            await shutDownLatch.wait()
            return
        }
        for slot in slots {
            try? await slot.shutdown().get()
        }
        await cluster?.shutdown()
        await sentinel?.shutdown()
        if ownsGroup {
            try? await group.shutdownGracefully()
        }
        shutDownLatch.open()
    }
}

/// The replies of a ``RedisClient/submit(_:ordered:)``, to be awaited or heard on a loop.
public struct RedisPendingReplies: Sendable {
    let future: EventLoopFuture<[RESPValue]>

    /// Calls `body` with the replies on `loop` (handed there from the connection's loop).
    public func whenComplete(on loop: any EventLoop, _ body: @escaping @Sendable (Result<[RESPValue], RedisError>) -> Void) {
        future.hop(to: loop).whenComplete { body($0.mapError(Self.redisError)) }
    }

    public func get() async throws(RedisError) -> [RESPValue] {
        do {
            return try await future.get()
        } catch {
            throw Self.redisError(error)
        }
    }

    /// A failure as the client names it: a connection's own error is a lost connection.
    private static func redisError(_ error: any Error) -> RedisError {
        error as? RedisError ?? .connectionLost("\(error)")
    }
}
