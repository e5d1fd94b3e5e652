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

    /// The first connection for calls whose order matters (``RedisClient/submit(_:)``), else
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
    /// their groups are written before this returns. Ordered calls (``RedisClient/submit(_:)``)
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
        switch start {
        case .shutDown:
            return loop.makeFailedFuture(RedisError.shutdown)
        case .now(let groups):
            let sends = groups.map { write($0.node, $0.indices, asking: false, commands, routed, deadline: deadline, ordered: ordered) }
            promise.completeWithTask {
                try await self.complete(commands, routed, sends, deadline: deadline, ordered: ordered)
            }
        case .later(let after, let written):
            promise.completeWithTask {
                let sends = try await self.writeOnceMapped(commands, routed, after: after, written: written,
                                                           deadline: deadline, ordered: ordered)
                return try await self.complete(commands, routed, sends, deadline: deadline, ordered: ordered)
            }
        }
        return promise.futureResult
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

    /// What a command still needs after a round.
    enum Pending {
        case redirected(RedisClusterRedirect)
        /// Its node refused the connection: it was never written.
        case unreachable(RedisError)

        /// `MOVED` or `ASK` (bounded by ``RedisConfiguration/maxRedirects``; waiting out
        /// `TRYAGAIN` and unreachable nodes is bounded by the call's deadline).
        var isRedirect: Bool {
            switch self {
            case .redirected(.moved), .redirected(.ask): true
            case .redirected(.again), .unreachable: false
            }
        }
    }

    private func complete(_ commands: RedisCommandBuffer, _ routed: [RedisCommandBuffer.Routed], _ first: [Send],
                          deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [RESPValue] {
        var replies = [RESPValue?](repeating: nil, count: routed.count)
        var sends = first
        var round = 0, redirects = 0
        while true {
            var pending: [Int: Pending] = [:]
            for send in sends {
                let got: [RESPValue]
                do {
                    got = try await send.replies.get()
                } catch let error as RedisError {
                    send.node.errors.increment()
                    guard case .unavailable = error else { throw error }
                    for index in send.indices { pending[index] = .unreachable(error) }
                    continue
                } catch {
                    throw .connectionLost("\(error)")
                }
                let stride = send.asking ? 2 : 1
                guard got.count == send.indices.count * stride else {
                    throw .protocolError("\(got.count) replies to \(send.indices.count * stride) commands")
                }
                if got.contains(where: \.isError) { send.node.errors.increment() }
                for (position, index) in send.indices.enumerated() {
                    let reply = got[position * stride + stride - 1]
                    if case .error(let message) = reply, let redirect = RedisClusterRedirect(message, asked: send.node.address) {
                        pending[index] = .redirected(redirect)
                    }
                    replies[index] = Self.merged(replies[index], reply)
                }
            }
            if pending.isEmpty { break }
            round += 1
            if pending.values.contains(where: \.isRedirect) { redirects += 1 }
            guard redirects <= configuration.maxRedirects,
                  let next = try await followUp(pending, commands, routed, round: round, deadline: deadline, ordered: ordered) else {
                for case .unreachable(let error) in pending.values { throw error }
                break
            }
            for index in pending.keys { replies[index] = nil }
            sends = next
        }
        return replies.map { $0 ?? .null }
    }

    /// Sends the pending commands where their redirects say (after reading the map again when
    /// one of them says it changed, after a backoff when one asks to try again); nil when
    /// the deadline is too near for another round.
    private func followUp(_ pending: [Int: Pending], _ commands: RedisCommandBuffer, _ routed: [RedisCommandBuffer.Routed],
                          round: Int, deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [Send]? {
        let readsBefore = state.withLock { $0.readsStarted }
        var asked: [RedisNodeAddress: [Int]] = [:]
        var moved: [RedisNodeAddress: [Int]] = [:]
        var toOwners: [Int] = []
        var mapChanged = false, unreachable = false
        var wait = false
        for (index, why) in pending {
            switch why {
            case .redirected(.ask(let address)):
                askRedirects.add(1, ordering: .relaxed)
                Self.askMetric.increment()
                asked[address, default: []].append(index)
            case .redirected(.moved(let address)):
                // The named node is the owner whatever the map read next says yet.
                movedRedirects.add(1, ordering: .relaxed)
                Self.movedMetric.increment()
                mapChanged = true
                moved[address, default: []].append(index)
            case .unreachable:
                mapChanged = true
                unreachable = true
                toOwners.append(index)
            case .redirected(.again):
                wait = true
                toOwners.append(index)
            }
        }
        if unreachable {
            // Who serves those slots now (a replica that took over) takes a map read.
            await refresh(startedAfter: readsBefore, deadline: deadline)
        } else if mapChanged {
            // The named nodes are resent to at once; the map is read meanwhile, for later calls.
            Task { await self.refresh(startedAfter: readsBefore) }
        }
        if wait || (unreachable && round > 1) {
            let delay = configuration.reconnectBackoff.delay(attempt: round - 1)
            guard timeLeft(before: deadline) > delay + resendMargin else { return nil }
            do {
                try await Task.sleep(for: delay)
            } catch {
                throw .timedOut
            }
        }
        guard timeLeft(before: deadline) > resendMargin else { return nil }
        // The call's commands for every node (`WAIT` for its writes, `SCRIPT LOAD`) go again
        // with each resent group, after the commands they followed: a `WAIT` answers for the
        // writes on its own node only.
        let everywhere = routed.indices.filter { routed[$0].everyNode && pending[$0] == nil }
        var targets: [(node: RedisNode, indices: [Int], asking: Bool)] = []
        let known = state.withLock { state -> Bool in
            guard !state.isShutDown else { return false }
            for (address, indices) in asked { targets.append((Self.node(address, &state, self), (indices + everywhere).sorted(), true)) }
            for (address, indices) in moved { targets.append((Self.node(address, &state, self), (indices + everywhere).sorted(), false)) }
            guard !toOwners.isEmpty else { return true }
            guard let groups = Self.group((toOwners + everywhere).sorted(), routed, &state, self) else { return false }
            targets += groups.map { ($0.node, $0.indices, false) }
            return true
        }
        guard known else { throw state.withLock { $0.isShutDown } ? .shutdown : .unavailable("no Redis Cluster master is known for the call's slots") }
        return targets.map { write($0.node, $0.indices, asking: $0.asking, commands, routed, deadline: deadline, ordered: ordered) }
    }

    /// A command's reply, given the one it had (from another node, or an earlier round, for
    /// the commands that go to every node of a call): an error anywhere is its reply, and of
    /// two counts (`WAIT`'s replicas) the smaller, which holds for every node's writes.
    static func merged(_ earlier: RESPValue?, _ reply: RESPValue) -> RESPValue {
        guard let earlier else { return reply }
        if earlier.isError { return earlier }
        if reply.isError { return reply }
        if case .integer(let first) = earlier, case .integer(let second) = reply { return .integer(min(first, second)) }
        return earlier
    }

    func timeLeft(before deadline: NIODeadline) -> Duration {
        .nanoseconds((deadline - .now()).nanoseconds)
    }
}

extension RESPValue {
    var isError: Bool {
        if case .error = self { return true }
        return false
    }
}
