import Common
import NIOCore
import Synchronization

/// One read of the slot map, which any number of calls may wait for.
final class SlotMapRead: Sendable {
    let number: Int
    let done = AsyncLatch()
    let found = Atomic<Bool>(false)

    init(number: Int) {
        self.number = number
    }
}

extension RedisClusterRouter {
    /// A node the map no longer names is closed this long after it left it: calls written to
    /// it before have ended by then (their deadline passed).
    var retirementGrace: Duration { configuration.commandTimeout * 2 }

    /// The masters the slot map names now.
    var masters: [RedisNodeAddress] { state.withLock { $0.topology.masters } }

    var connectedCount: Int {
        state.withLock { Array($0.nodes.values) }.reduce(0) { $0 + $1.connectedCount }
    }

    /// The node at `address`, made on first use (or taken back from the retired ones).
    static func node(_ address: RedisNodeAddress, _ state: inout State, _ router: RedisClusterRouter) -> RedisNode {
        if let node = state.nodes[address] { return node }
        if let (node, _) = state.retired.removeValue(forKey: address) {
            state.nodes[address] = node
            return node
        }
        let node = RedisNode(address: address, configuration: router.configuration, loops: router.loops,
                             firstLoop: state.nextLoop, sslContext: router.sslContext, logger: router.logger)
        state.nextLoop &+= 1
        state.nodes[address] = node
        return node
    }

    /// Reads the slot map again, one read at a time: a caller joins the read under way when it
    /// started after `startedAfter` reads had (after what made the caller ask), else a new read
    /// starts once that one ended. Waits until the read ended, or until `deadline` (the read
    /// goes on for the others). False when no node answered in time.
    @discardableResult
    func refresh(startedAfter seen: Int? = nil, deadline: NIODeadline? = nil) async -> Bool {
        let read = state.withLock { state -> SlotMapRead? in
            guard !state.isShutDown else { return nil }
            if let running = state.reading, running.number > (seen ?? -1) { return running }
            state.readsStarted += 1
            let read = SlotMapRead(number: state.readsStarted)
            let previous = state.reading
            state.reading = read
            Task {
                _ = await previous?.done.wait()
                read.found.store(await self.discover(), ordering: .relaxed)
                self.state.withLock { if $0.reading === read { $0.reading = nil } }
                read.done.open()
            }
            return read
        }
        guard let read else { return false }
        if let deadline {
            guard await read.done.wait(atMost: timeLeft(before: deadline)) else { return false }
        } else {
            _ = await read.done.wait()
        }
        return read.found.load(ordering: .relaxed)
    }

    /// Asks the known masters, then the seeds, for the slot map; installs the first one read.
    private func discover() async -> Bool {
        refreshes.add(1, ordering: .relaxed)
        Self.refreshMetric.increment()
        let known = state.withLock { $0.topology.masters }
        var candidates = known
        for seed in seeds where !candidates.contains(seed) { candidates.append(seed) }
        var failures: [String] = []
        for address in candidates {
            guard let node = state.withLock({ $0.isShutDown ? nil : Self.node(address, &$0, self) }) else { return false }
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
            if state.topology != topology {
                logger.info("Redis Cluster slot map", metadata: [
                    "redis.masters": "\(topology.masters)", "redis.slots_served": "\(topology.coveredSlots)",
                ])
            }
            state.topology = topology
            Self.mastersMetric.record(topology.masters.count)
            let now = NIODeadline.now()
            for (address, node) in state.nodes where !topology.masters.contains(address) {
                state.nodes[address] = nil
                state.retired[address] = (node, now)
            }
            let grace = TimeAmount.nanoseconds(retirementGrace.totalNanoseconds)
            let expired = state.retired.filter { now - $0.value.since > grace }
            for address in expired.keys { state.retired[address] = nil }
            // Under the lock: a node made again at the same address later gets series of its own.
            for (_, retired) in expired { retired.node.dropSeries() }
            return expired.values.map(\.node)
        }
        if !closing.isEmpty {
            Task { for node in closing { await node.shutdown() } }
        }
    }

    /// Reads the map every ``RedisConfiguration/topologyRefreshInterval`` until cancelled.
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
                state.retired = [:]
            }
            return Array(state.nodes.values) + state.retired.values.map(\.node)
        }
        for node in nodes { await node.shutdown() }
    }
}
