import Common
import Logging
import NIOCore
import NIOSSL
import Synchronization

/// One cluster node's connections (``RedisConfiguration/connections`` of them).
final class RedisNode: Sendable {
    let address: RedisNodeAddress
    let connections: [RedisSlot]
    private let next = Atomic<Int>(0)

    init(address: RedisNodeAddress, configuration: RedisConfiguration, loops: [any EventLoop], firstLoop: Int,
         sslContext: NIOSSLContext?, logger: Logger) {
        self.address = address
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

    func shutdown() async {
        for connection in connections { try? await connection.shutdown().get() }
    }
}

/// Routes a Redis client's calls over a Redis Cluster: each command goes to the master of its
/// key's hash slot, and a call's commands are pipelined to every node they need at once (one
/// round trip per node, in parallel). Commands without a key (`SCRIPT LOAD`, `INFO`) go to
/// every node the call reaches, or to one master when it reaches none.
///
/// The slot map comes from `CLUSTER SHARDS` (`CLUSTER SLOTS` on older servers), asked of the
/// known masters, then of the seeds; it is refreshed every
/// ``RedisConfiguration/topologyRefreshInterval``, on a `MOVED` and when a master refuses
/// connections. Error replies that redirect are followed (``RedisConfiguration/maxRedirects``
/// rounds at most): `MOVED` resends to the new owner, `ASK` sends
/// `ASKING` and the command to the named node once, `TRYAGAIN`/`CLUSTERDOWN`/`LOADING` wait
/// (backoff with jitter) and resend until the call's deadline. A command still redirected
/// after that keeps its error reply. Commands whose node could not be connected to were never
/// written: they are sent again once the map was refreshed (a replica taking over), until the
/// deadline, then the call fails; a connection lost or late after writing fails the call (the
/// commands may have run), as with one node.
final class RedisClusterRouter: Sendable {
    let configuration: RedisConfiguration
    private let seeds: [RedisNodeAddress]
    private let loops: [any EventLoop]
    private let sslContext: NIOSSLContext?
    private let logger: Logger

    private struct State {
        var topology = RedisClusterTopology()
        var nodes: [RedisNodeAddress: RedisNode] = [:]
        /// Nodes no longer masters: closed at the next refresh (calls may still be using them).
        var retired: [RedisNode] = []
        var refreshing: Task<Bool, Never>?
        var nextLoop = 0
        var isShutDown = false
    }

    private let state = Mutex(State())
    /// Counters for metrics and tests.
    let refreshes = Atomic<Int>(0)
    let movedRedirects = Atomic<Int>(0)
    let askRedirects = Atomic<Int>(0)

    init(configuration: RedisConfiguration, loops: [any EventLoop], sslContext: NIOSSLContext?, logger: Logger) {
        self.configuration = configuration
        var seeds = [RedisNodeAddress(host: configuration.url.host, port: configuration.url.port)]
        for seed in configuration.clusterSeeds where !seeds.contains(seed) { seeds.append(seed) }
        self.seeds = seeds
        self.loops = loops
        self.sslContext = sslContext
        self.logger = logger
    }

    /// The masters the slot map names now.
    var masters: [RedisNodeAddress] { state.withLock { $0.topology.masters } }

    var connectedCount: Int {
        state.withLock { Array($0.nodes.values) }.reduce(0) { count, node in
            count + node.connections.reduce(0) { $0 + ($1.isConnected.load(ordering: .relaxed) ? 1 : 0) }
        }
    }

    // MARK: Calls

    /// One group of a call's commands on its way to one node.
    private struct Send {
        let node: RedisNode
        let indices: [Int]
        /// Each command went after an `ASKING` (whose reply is skipped).
        let asking: Bool
        let replies: EventLoopFuture<[RESPValue]>
    }

    /// Runs the commands; their replies in order. When the slot map knows every slot they need,
    /// their groups are written before this returns, so that calls made one after another on
    /// ordered connections run in that order on each node.
    func execute(_ commands: RedisCommandBuffer, deadline: NIODeadline, ordered: Bool) -> EventLoopFuture<[RESPValue]> {
        let loop = loops[0]
        let routed: [RedisCommandBuffer.Routed]
        do {
            routed = try commands.routed()
        } catch {
            return loop.makeFailedFuture(error)
        }
        guard !routed.isEmpty else { return loop.makeSucceededFuture([]) }
        let first = plan(routed, commands, deadline: deadline, ordered: ordered)
        let promise = loop.makePromise(of: [RESPValue].self)
        promise.completeWithTask {
            try await self.complete(commands, routed, first: first, deadline: deadline, ordered: ordered)
        }
        return promise.futureResult
    }

    /// Runs keyless commands on every master, one round trip each, in parallel.
    func onEveryMaster(_ commands: RedisCommandBuffer, deadline: NIODeadline) async throws(RedisError)
        -> [(node: RedisNodeAddress, replies: [RESPValue])] {
        let nodes = state.withLock { state in state.topology.masters.map { node($0, &state) } }
        let calls = nodes.map { ($0.address, RedisPendingReplies(future: $0.connection(ordered: false).execute(commands, deadline: deadline))) }
        var results: [(node: RedisNodeAddress, replies: [RESPValue])] = []
        for (address, call) in calls { results.append((address, try await call.get())) }
        return results
    }

    /// Writes every command to the master of its slot; nil (nothing written) when the map
    /// lacks one of them.
    private func plan(_ routed: [RedisCommandBuffer.Routed], _ commands: RedisCommandBuffer, deadline: NIODeadline,
                      ordered: Bool) -> [Send]? {
        guard let groups = group(Array(routed.indices), routed) else { return nil }
        return groups.map { write($0.node, $0.indices, asking: false, commands, routed, deadline: deadline, ordered: ordered) }
    }

    /// The commands at `indices` grouped by the master of their slots, keyless ones in every
    /// group (or with the first master); nil when a slot has no known master.
    private func group(_ indices: [Int], _ routed: [RedisCommandBuffer.Routed]) -> [(node: RedisNode, indices: [Int])]? {
        state.withLock { state -> [(node: RedisNode, indices: [Int])]? in
            guard !state.isShutDown, !state.topology.masters.isEmpty else { return nil }
            var order: [RedisNodeAddress] = []
            var groups: [RedisNodeAddress: [Int]] = [:]
            var keyless: [Int] = []
            for index in indices {
                guard let slot = routed[index].slot else {
                    keyless.append(index)
                    continue
                }
                guard let owner = state.topology.owner(of: slot) else { return nil }
                if groups[owner] == nil { order.append(owner) }
                groups[owner, default: []].append(index)
            }
            if order.isEmpty { order.append(state.topology.masters[0]) }
            return order.map { address in
                // Keyless commands keep their place among the others.
                let members = keyless.isEmpty ? groups[address, default: []] : (groups[address, default: []] + keyless).sorted()
                return (node(address, &state), members)
            }
        }
    }

    /// The node at `address`, made on first use.
    private func node(_ address: RedisNodeAddress, _ state: inout State) -> RedisNode {
        if let node = state.nodes[address] { return node }
        let node = RedisNode(address: address, configuration: configuration, loops: loops, firstLoop: state.nextLoop,
                             sslContext: sslContext, logger: logger)
        state.nextLoop &+= 1
        state.nodes[address] = node
        return node
    }

    private func node(_ address: RedisNodeAddress) -> RedisNode? {
        state.withLock { $0.isShutDown ? nil : node(address, &$0) }
    }

    private func write(_ node: RedisNode, _ indices: [Int], asking: Bool, _ commands: RedisCommandBuffer,
                       _ routed: [RedisCommandBuffer.Routed], deadline: NIODeadline, ordered: Bool) -> Send {
        let subset = commands.subset(indices.map { routed[$0] }, prefix: asking ? RedisCommand("ASKING") : nil)
        return Send(node: node, indices: indices, asking: asking,
                    replies: node.connection(ordered: ordered).execute(subset, deadline: deadline))
    }

    /// What a command still needs after a round.
    private enum Pending {
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

    private func complete(_ commands: RedisCommandBuffer, _ routed: [RedisCommandBuffer.Routed], first: [Send]?,
                          deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [RESPValue] {
        var replies = [RESPValue?](repeating: nil, count: routed.count)
        var sends: [Send]
        if let first {
            sends = first
        } else {
            _ = await refresh()
            guard let again = plan(routed, commands, deadline: deadline, ordered: ordered) else {
                throw .unavailable("no Redis Cluster master is known for the call's slots")
            }
            sends = again
        }
        var round = 0, redirects = 0
        while true {
            var pending: [Int: Pending] = [:]
            for send in sends {
                let got: [RESPValue]
                do {
                    got = try await send.replies.get()
                } catch let error as RedisError {
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
                for (position, index) in send.indices.enumerated() {
                    let reply = got[position * stride + stride - 1]
                    if case .error(let message) = reply, let redirect = RedisClusterRedirect(message, asked: send.node.address) {
                        pending[index] = .redirected(redirect)
                    }
                    // A keyless command sent to several nodes: an error anywhere is its reply.
                    if replies[index] == nil || reply.isError { replies[index] = reply }
                }
            }
            if pending.isEmpty { break }
            round += 1
            if pending.values.contains(where: \.isRedirect) { redirects += 1 }
            if redirects > configuration.maxRedirects || NIODeadline.now() >= deadline {
                for case .unreachable(let error) in pending.values { throw error }
                break
            }
            for index in pending.keys { replies[index] = nil }
            sends = try await followUp(pending, commands, routed, round: round, deadline: deadline, ordered: ordered)
        }
        return replies.map { $0 ?? .null }
    }

    /// Sends the pending commands where their redirects say (after a refresh when one of
    /// them says the map changed, after a backoff when one asks to try again).
    private func followUp(_ pending: [Int: Pending], _ commands: RedisCommandBuffer, _ routed: [RedisCommandBuffer.Routed],
                          round: Int, deadline: NIODeadline, ordered: Bool) async throws(RedisError) -> [Send] {
        var asked: [RedisNodeAddress: [Int]] = [:]
        var moved: [RedisNodeAddress: [Int]] = [:]
        var toOwners: [Int] = []
        var mapChanged = false
        var wait = false
        for (index, why) in pending {
            switch why {
            case .redirected(.ask(let address)):
                askRedirects.add(1, ordering: .relaxed)
                asked[address, default: []].append(index)
            case .redirected(.moved(let address)):
                // The named node is the owner whatever the refreshed map says yet.
                movedRedirects.add(1, ordering: .relaxed)
                mapChanged = true
                moved[address, default: []].append(index)
            case .unreachable:
                mapChanged = true
                toOwners.append(index)
            case .redirected(.again):
                wait = true
                toOwners.append(index)
            }
        }
        if mapChanged { _ = await refresh() }
        if wait || (mapChanged && round > 1) {
            let delay = configuration.reconnectBackoff.delay(attempt: round - 1)
            let left = deadline - .now()
            guard left > .zero else { throw .timedOut }
            try? await Task.sleep(for: min(delay, .nanoseconds(left.nanoseconds)))
            if Task.isCancelled { throw .timedOut }
        }
        var sends: [Send] = []
        for (address, indices) in asked {
            guard let node = node(address) else { throw .shutdown }
            sends.append(write(node, indices.sorted(), asking: true, commands, routed, deadline: deadline, ordered: ordered))
        }
        for (address, indices) in moved {
            guard let node = node(address) else { throw .shutdown }
            sends.append(write(node, indices.sorted(), asking: false, commands, routed, deadline: deadline, ordered: ordered))
        }
        if !toOwners.isEmpty {
            guard let groups = group(toOwners.sorted(), routed) else {
                throw .unavailable("no Redis Cluster master is known for the call's slots")
            }
            for group in groups {
                sends.append(write(group.node, group.indices, asking: false, commands, routed, deadline: deadline, ordered: ordered))
            }
        }
        return sends
    }

    // MARK: Topology

    /// Reads the slot map again (one refresh at a time: callers meanwhile wait for it). False
    /// when no node answered.
    @discardableResult
    func refresh() async -> Bool {
        let task = state.withLock { state -> Task<Bool, Never> in
            if let running = state.refreshing { return running }
            let task = Task { await self.discover() }
            state.refreshing = task
            return task
        }
        let found = await task.value
        state.withLock { if $0.refreshing == task { $0.refreshing = nil } }
        return found
    }

    private func discover() async -> Bool {
        refreshes.add(1, ordering: .relaxed)
        let known = state.withLock { $0.topology.masters }
        var candidates = known
        for seed in seeds where !candidates.contains(seed) { candidates.append(seed) }
        var failures: [String] = []
        for address in candidates {
            guard let node = node(address) else { return false }
            let deadline = NIODeadline.now() + .nanoseconds(configuration.commandTimeout.totalNanoseconds)
            do {
                let shards = try await node.connection(ordered: false).execute(
                    RedisCommandBuffer([RedisCommand("CLUSTER", ["SHARDS"])]), deadline: deadline).get()[0]
                var topology = RedisClusterTopology(shards: shards, asked: address, tls: configuration.url.tls)
                if topology == nil || shards.isError {
                    let slots = try await node.connection(ordered: false).execute(
                        RedisCommandBuffer([RedisCommand("CLUSTER", ["SLOTS"])]), deadline: deadline).get()[0]
                    if case .error(let message) = slots { throw RedisError.server(message) }
                    topology = RedisClusterTopology(slots: slots, asked: address)
                }
                guard let topology, topology.coveredSlots > 0 else {
                    failures.append("\(address): no slot map in its answer")
                    continue
                }
                install(topology)
                return true
            } catch {
                failures.append("\(address): \(error)")
            }
        }
        logger.warning("cannot read the Redis Cluster's slot map", metadata: ["redis.errors": "\(failures)"])
        return false
    }

    private func install(_ topology: RedisClusterTopology) {
        let closing = state.withLock { state -> [RedisNode] in
            let changed = state.topology != topology
            if changed {
                logger.info("Redis Cluster slot map", metadata: [
                    "redis.masters": "\(topology.masters)", "redis.slots_served": "\(topology.coveredSlots)",
                ])
            }
            state.topology = topology
            let closing = state.retired
            state.retired = []
            for (address, node) in state.nodes where !topology.masters.contains(address) {
                state.nodes[address] = nil
                state.retired.append(node)
            }
            return closing
        }
        if !closing.isEmpty {
            Task { for node in closing { await node.shutdown() } }
        }
    }

    /// Refreshes every ``RedisConfiguration/topologyRefreshInterval`` until cancelled.
    func refreshPeriodically() async {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: configuration.topologyRefreshInterval)
            } catch {
                return
            }
            await refresh()
        }
    }

    func shutdown() async {
        let nodes = state.withLock { state -> [RedisNode] in
            state.isShutDown = true
            defer {
                state.nodes = [:]
                state.retired = []
            }
            return Array(state.nodes.values) + state.retired
        }
        for node in nodes { await node.shutdown() }
    }
}

extension RESPValue {
    var isError: Bool {
        if case .error = self { return true }
        return false
    }
}
