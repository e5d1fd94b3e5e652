import Common
import Logging
import Metrics
import NIOCore
import NIOSSL
import Synchronization

/// One cluster node's connections (``RedisConfiguration/connections`` of them).
final class RedisNode: Sendable {
    let address: RedisNodeAddress
    let connections: [RedisSlot]
    private let next = Atomic<Int>(0)
    /// Round trips to this node (`apns_relay_redis_node_requests_total{node}`), and those that
    /// failed or came back with an error reply (`apns_relay_redis_node_errors_total{node}`).
    let requests: Counter
    let errors: Counter

    init(address: RedisNodeAddress, configuration: RedisConfiguration, loops: [any EventLoop], firstLoop: Int,
         sslContext: NIOSSLContext?, logger: Logger) {
        self.address = address
        let factory = configuration.metricsFactory ?? MetricsSystem.factory
        requests = Counter(label: "apns_relay_redis_node_requests_total", dimensions: [("node", address.description)], factory: factory)
        errors = Counter(label: "apns_relay_redis_node_errors_total", dimensions: [("node", address.description)], factory: factory)
        var nodeConfiguration = configuration
        nodeConfiguration.url.host = address.host
        nodeConfiguration.url.port = address.port
        nodeConfiguration.url.database = 0
        connections = (0..<configuration.connections).map { index in
            RedisSlot(eventLoop: loops[(firstLoop + index) % loops.count], configuration: nodeConfiguration,
                      sslContext: sslContext, logger: logger)
        }
    }

    /// The first connection for calls whose order matters (``RedisClient/submit(_:ordered:)``), else
    /// the next one round robin.
    func connection(ordered: Bool) -> RedisSlot {
        ordered ? connections[0] : connections[next.wrappingAdd(1, ordering: .relaxed).oldValue % connections.count]
    }

    var connectedCount: Int {
        connections.reduce(0) { $0 + ($1.isConnected.load(ordering: .relaxed) ? 1 : 0) }
    }

    func shutdown() async {
        for connection in connections { try? await connection.shutdown().get() }
    }

    /// The node left the cluster's map for good: its series go (a pod's address is not seen
    /// again once the pod is replaced; kept, they would grow with every replacement).
    func dropSeries() {
        requests.destroy()
        errors.destroy()
    }
}

/// Routes a Redis client's calls over a Redis Cluster: each command goes to the master of its
/// key's hash slot, and a call's commands are pipelined to every node they need at once (one
/// round trip per node, in parallel). `SCRIPT`, `INFO`, `WAIT` and the like go to every node
/// the call reaches (one master when it reaches none); other commands without a key go to one.
///
/// The slot map comes from `CLUSTER SHARDS` (`CLUSTER SLOTS` on older servers), asked of the
/// known masters, then of the seeds; it is read on first use, every
/// ``RedisConfiguration/topologyRefreshInterval``, on a `MOVED` and when a master refuses
/// connections (``RedisClusterRouter+Topology``). Error replies that redirect are followed:
/// `MOVED` resends to the named node, `ASK` sends `ASKING` and the command to it once
/// (``RedisConfiguration/maxRedirects`` rounds of these at most); `TRYAGAIN`, `CLUSTERDOWN` and
/// `LOADING` wait (backoff with jitter) and resend. Commands whose node refused the connection
/// were never written: they are sent again once the map was read again (a replica taking
/// over). Nothing is sent once the call's deadline is near: a command still redirected keeps
/// its error reply, an unreachable node fails the call. A connection lost or late after
/// writing fails the call (the commands may have run), as with one node.
final class RedisClusterRouter: Sendable {
    let configuration: RedisConfiguration
    let seeds: [RedisNodeAddress]
    let loops: [any EventLoop]
    let sslContext: NIOSSLContext?
    let logger: Logger

    struct State {
        var topology = RedisClusterTopology()
        var nodes: [RedisNodeAddress: RedisNode] = [:]
        /// Nodes the map no longer names, and since when: closed once no call can be using
        /// them any more (``RedisClusterRouter/retirementGrace``), taken back if named again.
        var retired: [RedisNodeAddress: (node: RedisNode, since: NIODeadline)] = [:]
        /// The slot-map read under way; reads are numbered as they start.
        var reading: SlotMapRead?
        var readsStarted = 0
        /// While an ordered call waits for the slot map, later ordered calls are written after
        /// it: this completes once it was written.
        var orderedGate: EventLoopFuture<Void>?
        var nextLoop = 0
        var isShutDown = false
    }

    let state = Locked(State())
    /// Counters for tests; the same go to metrics: `apns_relay_redis_redirects_total{kind}`,
    /// `apns_relay_redis_topology_refreshes_total`, and `apns_relay_redis_cluster_masters`.
    let refreshes = Atomic<Int>(0)
    let movedRedirects = Atomic<Int>(0)
    let askRedirects = Atomic<Int>(0)
    static let movedMetric = Counter(label: "apns_relay_redis_redirects_total", dimensions: [("kind", "moved")])
    static let askMetric = Counter(label: "apns_relay_redis_redirects_total", dimensions: [("kind", "ask")])
    static let refreshMetric = Counter(label: "apns_relay_redis_topology_refreshes_total")
    static let mastersMetric = Gauge(label: "apns_relay_redis_cluster_masters")

    init(configuration: RedisConfiguration, loops: [any EventLoop], sslContext: NIOSSLContext?, logger: Logger) {
        self.configuration = configuration
        var seeds = [RedisNodeAddress(host: configuration.url.host, port: configuration.url.port)]
        for seed in configuration.clusterSeeds where !seeds.contains(seed) { seeds.append(seed) }
        self.seeds = seeds
        self.loops = loops
        self.sslContext = sslContext
        self.logger = logger
    }

    /// No resend is started with less than this left before the call's deadline: it could
    /// not be answered in time, and a late answer closes its connection under every call
    /// pipelined on it.
    var resendMargin: Duration { min(configuration.commandTimeout / 10, .milliseconds(50)) }

    // MARK: Calls

    /// One group of a call's commands on its way to one node.
    struct Send {
        let node: RedisNode
        let indices: [Int]
        /// Each command went after an `ASKING` (whose reply is skipped).
        let asking: Bool
        let replies: EventLoopFuture<[RESPValue]>
    }

    /// Runs the commands; their replies in order. When the slot map knows every slot they need,
    /// their groups are written before this returns. Ordered calls (``RedisClient/submit(_:ordered:)``)
    /// are written in the order they are made, on each node's first connection: one that must
    /// wait for the map holds back the ordered calls after it until it was written.
    func execute(_ commands: RedisCommandBuffer, deadline: NIODeadline, ordered: Bool) -> EventLoopFuture<[RESPValue]> {
        let loop = loops[0]
        let routed: [RedisCommandBuffer.Routed]
        do {
            routed = try commands.routed()
        } catch {
            return loop.makeFailedFuture(error)
        }
        guard !routed.isEmpty else { return loop.makeSucceededFuture([]) }
        enum Start {
            case now([(node: RedisNode, indices: [Int])])
            case later(after: EventLoopFuture<Void>?, written: EventLoopPromise<Void>?)
            case shutDown
        }
        let start = state.withLock { state -> Start in
            if state.isShutDown { return .shutDown }
            if !ordered || state.orderedGate == nil, let groups = Self.group(Array(routed.indices), routed, &state, self) {
                return .now(groups)
            }
            guard ordered else { return .later(after: nil, written: nil) }
            let written = loop.makePromise(of: Void.self)
            defer { state.orderedGate = written.futureResult }
            return .later(after: state.orderedGate, written: written)
        }
        let promise = loop.makePromise(of: [RESPValue].self)
        let call = RedisClusterCall(everyNode: routed.map(\.everyNode), maxRedirects: configuration.maxRedirects)
        switch start {
        case .shutDown:
            return loop.makeFailedFuture(RedisError.shutdown)
        case .now(let groups):
            let sends = groups.map { write($0.node, $0.indices, asking: false, commands, routed, deadline: deadline, ordered: ordered) }
            drive(call, sends, commands, routed, deadline: deadline, ordered: ordered, promise: promise)
        case .later(let after, let written):
            Task {
                do {
                    let sends = try await self.writeOnceMapped(commands, routed, after: after, written: written,
                                                               deadline: deadline, ordered: ordered)
                    self.drive(call, sends, commands, routed, deadline: deadline, ordered: ordered, promise: promise)
                } catch {
                    promise.fail(error)
                }
            }
        }
        return promise.futureResult
    }

    /// Feeds a round's answers to `call` once every send of it answered (each is bounded by the
    /// call's deadline), on the event loop of the round's first send, and goes on as the call
    /// says: its replies or its error complete `promise`; a resend takes a task of its own,
    /// since it may read the slot map or wait a backoff first (redirects are rare: a reshard, a
    /// failover). A call the slot map routes at once and that needs no resend — nearly every
    /// call — takes no task (one that waits for the map, or behind an ordered call that does,
    /// takes one, ``writeOnceMapped``).
    private func drive(_ call: RedisClusterCall, _ sends: [Send], _ commands: RedisCommandBuffer,
                       _ routed: [RedisCommandBuffer.Routed], deadline: NIODeadline, ordered: Bool,
                       promise: EventLoopPromise<[RESPValue]>) {
        let loop = sends.first?.replies.eventLoop ?? promise.futureResult.eventLoop
        EventLoopFuture.whenAllComplete(sends.map(\.replies), on: loop).whenSuccess { results in
            var call = call
            for (send, result) in zip(sends, results) {
                let answer = result.mapError { ($0 as? RedisError) ?? .connectionLost("\($0)") }
                if call.answered(send.indices, asking: send.asking, from: send.node.address, answer) { send.node.errors.increment() }
            }
            switch call.roundEnded() {
            case .replies(let replies):
                promise.succeed(replies)
            case .failed(let error):
                promise.fail(error)
            case .resend(let resend):
                Task { [call] in
                    var call = call
                    do {
                        guard let next = try await self.followUp(resend, commands, routed, deadline: deadline, ordered: ordered) else {
                            switch call.gaveUp() {
                            case .replies(let replies): promise.succeed(replies)
                            case .failed(let error): promise.fail(error)
                            case .resend: preconditionFailure("a call that gave up plans no resend")
                            }
                            return
                        }
                        call.resent()
                        self.drive(call, next, commands, routed, deadline: deadline, ordered: ordered, promise: promise)
                    } catch {
                        promise.fail(error)
                    }
                }
            }
        }
    }

    /// Writes a call that had to wait: behind the ordered call before it, and for the slot map.
    private func writeOnceMapped(_ commands: RedisCommandBuffer, _ routed: [RedisCommandBuffer.Routed],
                                 after: EventLoopFuture<Void>?, written: EventLoopPromise<Void>?,
                                 deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [Send] {
        if let after { try? await after.get() }
        var groups = state.withLock { Self.group(Array(routed.indices), routed, &$0, self) }
        if groups == nil {
            await refresh(deadline: deadline)
            groups = state.withLock { Self.group(Array(routed.indices), routed, &$0, self) }
        }
        // The map read took the call's time: nothing is written (a connection made now would
        // get no time to connect, and its failure would hold the node's other calls back).
        if groups != nil, timeLeft(before: deadline) <= resendMargin { groups = nil }
        let sends = groups?.map { write($0.node, $0.indices, asking: false, commands, routed, deadline: deadline, ordered: ordered) }
        if let written {
            state.withLock { if $0.orderedGate === written.futureResult { $0.orderedGate = nil } }
            written.succeed(())
        }
        guard let sends else {
            throw timeLeft(before: deadline) <= resendMargin ? .timedOut : .unavailable("no Redis Cluster master is known for the call's slots")
        }
        return sends
    }

    /// Runs keyless commands on every master, one round trip each, in parallel.
    func onEveryMaster(_ commands: RedisCommandBuffer, deadline: NIODeadline) async throws(RedisError)
        -> [(node: RedisNode, replies: [RESPValue])] {
        let nodes = state.withLock { state -> [RedisNode]? in
            state.isShutDown ? nil : state.topology.masters.map { Self.node($0, &state, self) }
        }
        guard let nodes else { throw .shutdown }
        let calls = nodes.map { ($0, RedisPendingReplies(future: $0.connection(ordered: false).execute(commands, deadline: deadline))) }
        var results: [(node: RedisNode, replies: [RESPValue])] = []
        for (node, call) in calls { results.append((node, try await call.get())) }
        return results
    }

    /// The commands at `indices` grouped by the master of their slots; commands for every node
    /// in every group, other keyless ones in the first (a master when no command has a key).
    /// Nil when a slot has no known master.
    static func group(_ indices: [Int], _ routed: [RedisCommandBuffer.Routed], _ state: inout State,
                      _ router: RedisClusterRouter) -> [(node: RedisNode, indices: [Int])]? {
        guard !state.topology.masters.isEmpty else { return nil }
        var order: [RedisNodeAddress] = []
        var groups: [RedisNodeAddress: [Int]] = [:]
        var everywhere: [Int] = [], once: [Int] = []
        for index in indices {
            guard let slot = routed[index].slot else {
                if routed[index].everyNode { everywhere.append(index) } else { once.append(index) }
                continue
            }
            guard let owner = state.topology.owner(of: slot) else { return nil }
            if groups[owner] == nil { order.append(owner) }
            groups[owner, default: []].append(index)
        }
        if order.isEmpty { order.append(state.topology.masters[0]) }
        return order.enumerated().map { position, address in
            // Keyless commands keep their place among the others.
            var members = groups[address, default: []] + everywhere
            if position == 0 { members += once }
            return (node(address, &state, router), everywhere.isEmpty && once.isEmpty ? members : members.sorted())
        }
    }

    func write(_ node: RedisNode, _ indices: [Int], asking: Bool, _ commands: RedisCommandBuffer,
               _ routed: [RedisCommandBuffer.Routed], deadline: NIODeadline, ordered: Bool) -> Send {
        let subset = commands.subset(indices.map { routed[$0] }, prefix: asking ? RedisCommand("ASKING") : nil)
        node.requests.increment()
        return Send(node: node, indices: indices, asking: asking,
                    replies: node.connection(ordered: ordered).execute(subset, deadline: deadline))
    }

    /// Writes the commands of a resend where ``RedisClusterCall`` planned it: after reading
    /// the map again when a node was unreachable (in the background, for later calls, on a
    /// `MOVED`), after a backoff when it asks for one. Nil when the deadline is too near for
    /// another round.
    private func followUp(_ resend: RedisClusterCall.Resend, _ commands: RedisCommandBuffer,
                          _ routed: [RedisCommandBuffer.Routed], deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [Send]? {
        let readsBefore = state.withLock { $0.readsStarted }
        askRedirects.add(resend.asks, ordering: .relaxed)
        movedRedirects.add(resend.moves, ordering: .relaxed)
        if resend.asks > 0 { Self.askMetric.increment(by: Int64(resend.asks)) }
        if resend.moves > 0 { Self.movedMetric.increment(by: Int64(resend.moves)) }
        switch resend.readMap {
        case .first:
            await refresh(startedAfter: readsBefore, deadline: deadline)
        case .meanwhile:
            Task { await self.refresh(startedAfter: readsBefore) }
        case .no:
            break
        }
        if let attempt = resend.backoffAttempt {
            let delay = configuration.reconnectBackoff.delay(attempt: attempt)
            guard timeLeft(before: deadline) > delay + resendMargin else { return nil }
            do {
                try await Task.sleep(for: delay)
            } catch {
                throw .timedOut
            }
        }
        guard timeLeft(before: deadline) > resendMargin else { return nil }
        var targets: [(node: RedisNode, indices: [Int], asking: Bool)] = []
        let known = state.withLock { state -> Bool in
            guard !state.isShutDown else { return false }
            for (address, indices) in resend.asked { targets.append((Self.node(address, &state, self), indices, true)) }
            for (address, indices) in resend.moved { targets.append((Self.node(address, &state, self), indices, false)) }
            guard !resend.toOwners.isEmpty else { return true }
            guard let groups = Self.group(resend.toOwners, routed, &state, self) else { return false }
            targets += groups.map { ($0.node, $0.indices, false) }
            return true
        }
        guard known else { throw state.withLock { $0.isShutDown } ? .shutdown : .unavailable("no Redis Cluster master is known for the call's slots") }
        return targets.map { write($0.node, $0.indices, asking: $0.asking, commands, routed, deadline: deadline, ordered: ordered) }
    }

    func timeLeft(before deadline: NIODeadline) -> Duration {
        .nanoseconds((deadline - .now()).nanoseconds)
    }
}
