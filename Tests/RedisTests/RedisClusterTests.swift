import Common
import Foundation
@testable import Redis
import NIOCore
import NIOPosix
import RedisTesting
import MetricsTestKit
import Testing
import TestSupport

/// Starts a cluster off the cooperative pool (it waits for processes and polls the nodes).
func startCluster(masters: Int = 3, replicasPerMaster: Int = 0, nodeTimeoutMilliseconds: Int = 2000) async throws -> RedisClusterProcess {
    try await onOwnThread {
        Result { try RedisClusterProcess(masters: masters, replicasPerMaster: replicasPerMaster, nodeTimeoutMilliseconds: nodeTimeoutMilliseconds) }
    }.get()
}

/// Runs `body` with a cluster-mode client of `url`, shut down afterwards whatever happens. The
/// commands' deadline is 5 s unless a test is about deadlines: with the suite running beside a
/// build on two cores, a MOVED's map read and redirect once took over 2 s.
func withClusterClient<T>(_ url: String, timeout: Duration = .seconds(5), seeds: [RedisNodeAddress] = [],
                          _ body: (RedisClient) async throws -> T) async throws -> T {
    let client = try clusterClient(url, timeout: timeout, seeds: seeds)
    do {
        let result = try await body(client)
        await client.shutdown()
        return result
    } catch {
        await client.shutdown()
        throw error
    }
}

/// Runs blocking cluster tooling (redis-cli, process waits) off the cooperative pool.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await onOwnThread { Result { try body() } }.get()
}

func clusterClient(_ url: String, timeout: Duration = .seconds(5), seeds: [RedisNodeAddress] = []) throws -> RedisClient {
    var configuration = RedisConfiguration(url: try RedisURL(parsing: url))
    configuration.mode = .cluster
    configuration.clusterSeeds = seeds
    configuration.commandTimeout = timeout
    configuration.reconnectBackoff = Backoff(base: .milliseconds(20), maximum: .milliseconds(400))
    return try RedisClient(configuration: configuration)
}

@Suite("Redis Cluster: slots, slot maps, redirects (no server)", .timeLimit(.minutes(3)))
struct RedisClusterUnitTests {
    @Test func hashSlotsAreTheClusterSpecificationsOnes() {
        // The specification's CRC16 check value, and hash tags: the first {...} that is not empty.
        #expect(RedisHashSlot.crc16(Array("123456789".utf8)) == 0x31C3)
        #expect(RedisHashSlot.of("123456789") == 0x31C3 & 0x3FFF)
        #expect(RedisHashSlot.of("{user1000}.following") == RedisHashSlot.of("{user1000}.followers"))
        #expect(RedisHashSlot.of("{user1000}.following") == RedisHashSlot.of("user1000"))
        #expect(RedisHashSlot.of("foo{}{bar}") == Int(RedisHashSlot.crc16(Array("foo{}{bar}".utf8)) & 0x3FFF))
        #expect(RedisHashSlot.of("foo{{bar}}zap") == RedisHashSlot.of("{bar"))
        #expect(RedisHashSlot.of("foo{bar}{zap}") == RedisHashSlot.of("bar"))
        #expect(RedisHashSlot.of("foo{bar") != RedisHashSlot.of("bar"))
        #expect(RedisHashSlot.of("") == 0)
    }

    @Test func commandsAreReadBackWithTheirKeysSlots() throws {
        let script = RedisScript("return 1")
        let buffer = RedisCommandBuffer([
            RedisCommand("GET", ["apns-relay:rate:{abc}"]),
            RedisCommand.evalsha(script, keys: ["k1{tag}", "k2{tag}"], arguments: ["x"]),
            RedisCommand.evalsha(script, keys: [], arguments: ["x"]),
            RedisCommand("SCRIPT", ["LOAD", "return 1"]),
            RedisCommand("info", ["memory"]),
            RedisCommand("ZADD", ["apns-relay:due:{apns.intents:3}", 5, "member"]),
        ])
        let routed = try buffer.routed()
        #expect(routed.map(\.slot) == [RedisHashSlot.of("abc"), RedisHashSlot.of("tag"), nil, nil, nil,
                                       RedisHashSlot.of("apns.intents:3")])
        // A script without keys runs once; loading a script and INFO go to every node of the call.
        #expect(routed.map(\.everyNode) == [false, false, false, true, true, false])
        // The ranges cover the buffer, one after another, and cut it back into the same commands.
        #expect(routed.first?.range.lowerBound == 0 && routed.last?.range.upperBound == buffer.bytes.readableBytes)
        #expect(zip(routed, routed.dropFirst()).allSatisfy { $0.range.upperBound == $1.range.lowerBound })
        let again = buffer.subset([routed[5], routed[0]], prefix: RedisCommand("ASKING"))
        #expect(again.count == 4)
        #expect(try again.routed().map(\.slot) == [nil, RedisHashSlot.of("apns.intents:3"), nil, RedisHashSlot.of("abc")])
    }

    @Test func aBufferThatIsNotRESPIsRefused() {
        var buffer = RedisCommandBuffer()
        buffer.bytes.writeString("*2\r\n$3\r\nGET\r\n$10\r\nshort\r\n")
        buffer.count = 1
        #expect(throws: RedisError.self) { try buffer.routed() }
    }

    @Test func slotMapsFromShardsAndFromSlots() throws {
        let asked = RedisNodeAddress(host: "10.0.0.9", port: 7000)
        func node(_ fields: [(String, RESPValue)]) -> RESPValue {
            .array(fields.flatMap { [RESPValue.bulk(Array($0.0.utf8)), $0.1] })
        }
        func text(_ value: String) -> RESPValue { .bulk(Array(value.utf8)) }
        let shards: RESPValue = .array([
            node([("slots", .array([.integer(0), .integer(99), .integer(200), .integer(200)])),
                  ("nodes", .array([
                      node([("id", text("r")), ("port", .integer(7003)), ("ip", text("10.0.0.4")), ("endpoint", text("10.0.0.4")), ("role", text("replica"))]),
                      node([("id", text("f")), ("port", .integer(7008)), ("ip", text("10.0.0.8")), ("endpoint", text("10.0.0.8")),
                            ("role", text("master")), ("health", text("fail"))]),
                      node([("id", text("m")), ("port", .integer(7001)), ("tls-port", .integer(8001)), ("ip", text("10.0.0.1")),
                            ("endpoint", text("")), ("role", text("master")), ("health", text("online"))]),
                  ]))]),
            node([("slots", .array([.integer(100), .integer(199)])),
                  ("nodes", .array([node([("port", .integer(7002)), ("ip", text("")), ("endpoint", text("redis-2.internal")), ("role", text("master"))])]))]),
            // A shard with no slots (a new, empty master) serves nothing.
            node([("slots", .array([])), ("nodes", .array([node([("port", .integer(7009)), ("endpoint", text("e")), ("role", text("master"))])]))]),
        ])
        let fromShards = try #require(RedisClusterTopology(shards: shards, asked: asked, tls: false))
        #expect(fromShards.masters == [RedisNodeAddress(host: "10.0.0.1", port: 7001), RedisNodeAddress(host: "redis-2.internal", port: 7002)])
        // Two nodes' answers naming the same masters in another order describe the same map.
        let reversed: RESPValue = .array((shards.array ?? []).reversed())
        #expect(RedisClusterTopology(shards: reversed, asked: asked, tls: false) == fromShards)
        #expect(fromShards.owner(of: 0)?.port == 7001 && fromShards.owner(of: 99)?.port == 7001 && fromShards.owner(of: 200)?.port == 7001)
        #expect(fromShards.owner(of: 150)?.port == 7002 && fromShards.owner(of: 201) == nil)
        #expect(fromShards.coveredSlots == 201)
        #expect(RedisClusterTopology(shards: shards, asked: asked, tls: true)?.masters.first?.port == 8001)

        let slots: RESPValue = .array([
            .array([.integer(0), .integer(8191), .array([text(""), .integer(7000), text("a")]), .array([text("10.0.0.5"), .integer(7005)])]),
            .array([.integer(8192), .integer(16383), .array([text("10.0.0.2"), .integer(7002), text("b")])]),
        ])
        let fromSlots = try #require(RedisClusterTopology(slots: slots, asked: asked))
        // A range named twice goes to the last owner named; a master left with no slot is dropped.
        let overlapping: RESPValue = .array([
            .array([.integer(0), .integer(10), .array([text("10.0.0.1"), .integer(1)])]),
            .array([.integer(0), .integer(16383), .array([text("10.0.0.2"), .integer(2)])]),
        ])
        let overlapped = try #require(RedisClusterTopology(slots: overlapping, asked: asked))
        #expect(overlapped.masters == [RedisNodeAddress(host: "10.0.0.2", port: 2)] && overlapped.coveredSlots == RedisHashSlot.count)
        // Many masters named (each once over a range another takes back) never trap.
        let many: RESPValue = .array((0..<40_000).map { .array([.integer(0), .integer(0), .array([text("10.1.\($0 / 256).\($0 % 256)"), .integer(7000)])]) })
        #expect(RedisClusterTopology(slots: many, asked: asked)?.masters.count == 1)
        // A reply naming the whole slot range over and over is not a slot map (it took the
        // client's time without bound: 40,000 × 16,384 assignments).
        let repeated: RESPValue = .array((0..<40_000).map { _ in .array([.integer(0), .integer(16383), .array([text("10.2.0.1"), .integer(7000)])]) })
        #expect(RedisClusterTopology(slots: repeated, asked: asked) == nil)
        let repeatedShards: RESPValue = .array((0..<40_000).map { _ in
            node([("slots", .array([.integer(0), .integer(16383)])),
                  ("nodes", .array([node([("port", .integer(7000)), ("endpoint", text("10.2.0.1")), ("role", text("master"))])]))])
        })
        #expect(RedisClusterTopology(shards: repeatedShards, asked: asked, tls: false) == nil)
        #expect(fromSlots.masters == [RedisNodeAddress(host: "10.0.0.2", port: 7002), asked])
        #expect(fromSlots.coveredSlots == RedisHashSlot.count)
        // Not a slot map: nil, never a trap.
        for bad: RESPValue in [.integer(1), .array([.array([.integer(5), .integer(2), .array([text("h"), .integer(1)])])]),
                               .array([.array([.integer(0), .integer(16384), .array([text("h"), .integer(1)])])]),
                               .array([.array([.integer(0), .integer(1), .array([text("h"), .integer(70000)])])])] {
            #expect(RedisClusterTopology(slots: bad, asked: asked) == nil)
            #expect(RedisClusterTopology(shards: bad, asked: asked, tls: false) == nil)
        }
    }

    @Test func repliesFromSeveralNodesMergeToTheWeakest() {
        #expect(RedisClusterCall.merged(nil, .integer(2)) == .integer(2))
        #expect(RedisClusterCall.merged(.integer(2), .integer(1)) == .integer(1))
        #expect(RedisClusterCall.merged(.integer(1), .integer(3)) == .integer(1))
        #expect(RedisClusterCall.merged(.integer(1), .error("NOREPLICAS")) == .error("NOREPLICAS"))
        #expect(RedisClusterCall.merged(.error("ERR x"), .status("OK")) == .error("ERR x"))
        #expect(RedisClusterCall.merged(.status("OK"), .status("OK")) == .status("OK"))
    }

    @Test func redirectRepliesAreRead() {
        let asked = RedisNodeAddress(host: "10.0.0.9", port: 7000)
        #expect(RedisClusterRedirect("MOVED 3999 127.0.0.1:6381", asked: asked) == .moved(RedisNodeAddress(host: "127.0.0.1", port: 6381)))
        #expect(RedisClusterRedirect("ASK 3999 [::1]:6381", asked: asked) == .ask(RedisNodeAddress(host: "::1", port: 6381)))
        #expect(RedisClusterRedirect("MOVED 3999 :6381", asked: asked) == .moved(RedisNodeAddress(host: "10.0.0.9", port: 6381)))
        #expect(RedisClusterRedirect("TRYAGAIN Multiple keys request during rehashing of slot", asked: asked) == .again)
        #expect(RedisClusterRedirect("CLUSTERDOWN The cluster is down", asked: asked) == .again)
        #expect(RedisClusterRedirect("LOADING Redis is loading the dataset in memory", asked: asked) == .again)
        for other in ["ERR unknown command", "MOVED", "MOVED 1 nowhere", "ASK 1 host:99999", "WRONGTYPE x"] {
            #expect(RedisClusterRedirect(other, asked: asked) == nil)
        }
    }
}

@Suite("Redis Cluster client against a real cluster", .serialized, .timeLimit(.minutes(3)))
struct RedisClusterClientTests {
    @Test func hashSlotsMatchTheServers() async throws {
        let cluster = try await startCluster()
        let keys = (0..<300).map { index -> String in
            switch index % 3 {
            case 0: "apns-relay:rate:{\(String(index, radix: 16))}"
            case 1: "plain-\(index * 7919)"
            default: "x{}{\(index)}y{z}"
            }
        }
        let replies = try await withClusterClient(cluster.url) { client in
            try await client.onEveryNode(keys.map { RedisCommand("CLUSTER", ["KEYSLOT", $0]) })
        }
        #expect(replies.count == 3)
        #expect(replies[0].replies.map(\.integer) == keys.map { Int64(RedisHashSlot.of($0)) })
    }

    @Test func aCallsCommandsGoToTheirKeysMastersInOneRoundTripEach() async throws {
        let cluster = try await startCluster()
        let prefix = UUID().uuidString
        let keys = (0..<600).map { "\(prefix):\($0)" }
        try await withClusterClient(cluster.url) { client in
            let set = try await client.pipeline(keys.map { RedisCommand("SET", [$0, $0]) })
            #expect(set.allSatisfy { $0 == .status("OK") }, "\(set.first { $0 != .status("OK") }.map { "\($0)" } ?? "")")
            #expect(Set(client.nodes.map(\.port)) == Set(cluster.servers.prefix(3).map(\.port)))
            let got = try await client.pipeline(keys.map { RedisCommand("GET", [$0]) })
            #expect(got == keys.map { .bulk(Array($0.utf8)) })
            #expect(client.clusterCounters.moved == 0 && client.clusterCounters.refreshes == 1)
        }
        // Each key is on the master of its slot (a node answers only for its own slots).
        let owners = try await offPool { try cluster.masterPorts() }
        for server in cluster.servers.prefix(3) {
            let node = try RedisClientTests.client(server.url)
            let owned = keys.filter { owners[RedisHashSlot.of($0)] == server.port }
            #expect(!owned.isEmpty)
            let replies = try await node.pipeline(owned.map { RedisCommand("GET", [$0]) })
            #expect(replies == owned.map { .bulk(Array($0.utf8)) })
            await node.shutdown()
        }
    }

    @Test func scriptsAreLoadedOnEveryNodeThatRunsThem() async throws {
        let cluster = try await startCluster()
        let script = RedisScript("return redis.call('INCRBY', KEYS[1], ARGV[1]) -- \(UUID().uuidString)")
        let keys = (0..<60).map { "script-\(UUID().uuidString)-\($0)" }
        let owners = try await offPool { try cluster.masterPorts() }
        #expect(Set(keys.map { owners[RedisHashSlot.of($0)] }).count == 3)
        try await withClusterClient(cluster.url) { client in
            let replies = try await client.pipelineLoading([script], keys.map { RedisCommand.evalsha(script, keys: [$0], arguments: [2]) })
            #expect(replies == keys.map { _ in .integer(2) })
            #expect(try await client.evaluate(script, keys: [keys[0]], arguments: [3]) == .integer(5))
        }
    }

    @Test func aSeedThatIsDownIsPassedOver() async throws {
        let cluster = try await startCluster()
        let down = try await offPool { try RedisServerProcess.freePort() }
        try await withClusterClient("redis://127.0.0.1:\(down)/0", seeds: [RedisNodeAddress(host: "127.0.0.1", port: cluster.servers[1].port)]) { client async throws in
            #expect(try await client.send(RedisCommand("SET", ["seeded-\(UUID().uuidString)", "v"])) == .status("OK"))
        }
    }

    /// Seeds that take connections and never answer: the call fails at its deadline, not
    /// after one slot-map read (one call deadline) per seed.
    @Test func seedsThatNeverAnswerFailTheCallAtItsDeadline() async throws {
        var silent: [any Channel] = []
        for _ in 0..<4 {
            silent.append(try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .childChannelInitializer { channel in channel.eventLoop.makeSucceededVoidFuture() }
                .bind(host: "127.0.0.1", port: 0).get())
        }
        let seeds = silent.compactMap { $0.localAddress?.port }.map { RedisNodeAddress(host: "127.0.0.1", port: $0) }
        // From the call to its failure (the client's shutdown after it is not the call's: a
        // loaded clean-clone run spent over 2 s there).
        let failedAfter = Locked<Duration?>(nil)
        await #expect(throws: RedisError.self) {
            try await withClusterClient("redis://127.0.0.1:\(seeds[0].port)/0", timeout: .seconds(1), seeds: seeds) { client in
                let started = ContinuousClock.now
                do {
                    return try await client.send(RedisCommand("GET", ["anything"]))
                } catch {
                    failedAfter.withLock { $0 = ContinuousClock.now - started }
                    throw error
                }
            }
        }
        // Four reads of a second each would take four.
        let elapsed = try #require(failedAfter.withLock { $0 })
        #expect(elapsed >= .milliseconds(950) && elapsed < .milliseconds(3_000), "\(elapsed)")
        for channel in silent { try await channel.close() }
    }

    @Test func aClusterURLWithADatabaseIsRefused() {
        #expect(throws: RedisError.self) { try clusterClient("redis://127.0.0.1:6379/2") }
    }
}

/// Tests that move slots or kill nodes: a cluster each.
@Suite("Redis Cluster client while the cluster changes", .serialized, .timeLimit(.minutes(3)))
struct RedisClusterChangeTests {
    /// Moves `slot` (and its keys) from its master to `target` by hand, as `redis-cli --cluster
    /// reshard` does; `finish: false` leaves it half-way (migrating/importing).
    static func move(_ slot: Int, of cluster: RedisClusterProcess, to target: Int, keys: [String], finish: Bool = true) async throws {
        try await onOwnThread { Result { try moveBlocking(slot, of: cluster, to: target, keys: keys, finish: finish) } }.get()
    }

    private static func moveBlocking(_ slot: Int, of cluster: RedisClusterProcess, to target: Int, keys: [String], finish: Bool) throws {
        struct MoveFailed: Error { var why: String }
        guard let source = try cluster.masterPort(forSlot: slot) else { throw MoveFailed(why: "slot \(slot) has no master") }
        let sourceID = try cluster.nodeID(port: source), targetID = try cluster.nodeID(port: target)
        try cluster.cli(port: target, ["CLUSTER", "SETSLOT", "\(slot)", "IMPORTING", sourceID])
        try cluster.cli(port: source, ["CLUSTER", "SETSLOT", "\(slot)", "MIGRATING", targetID])
        for key in keys {
            let answer = try cluster.cli(port: source, ["MIGRATE", "127.0.0.1", "\(target)", key, "0", "5000"])
            guard answer.contains("OK") else { throw MoveFailed(why: "MIGRATE \(key): \(answer)") }
        }
        guard finish else { return }
        for server in cluster.servers.prefix(cluster.masters) {
            try cluster.cli(port: server.port, ["CLUSTER", "SETSLOT", "\(slot)", "NODE", targetID])
        }
        try cluster.waitUntilConsistent()
    }

    /// A master that leaves the slot map (every slot resharded away, as when a node is taken out)
    /// has its per-node series dropped once its grace passed: they do not grow with every pod
    /// address a cluster ever had.
    @Test func aNodeThatLeftTheMapHasItsSeriesDropped() async throws {
        let cluster = try await startCluster()
        let metrics = TestMetrics()
        var configuration = RedisConfiguration(url: try RedisURL(parsing: cluster.url))
        configuration.mode = .cluster
        // Short enough that the node's grace (two call deadlines) passes well within the wait
        // below; 500 ms was too short for a first call's connect and slot-map read in a loaded
        // full run (plain, and under the thread sanitizer).
        configuration.commandTimeout = slowed(.seconds(2))
        configuration.metricsFactory = metrics
        let client = try RedisClient(configuration: configuration)
        let ports = try cluster.masterPorts()
        let leaving = ports[0], staying = Self.otherMaster(than: ports[0], in: cluster)
        func nodes() -> Set<String> {
            Set(metrics.counters.filter { $0.label == "apns_relay_redis_node_requests_total" }.compactMap { counter in
                counter.dimensions.first { $0.0 == "node" }?.1
            })
        }
        // A key on every master: each node has its series.
        for index in 0..<64 { _ = try await client.send(RedisCommand("SET", ["series-\(index)", "x"])) }
        #expect(nodes().contains("127.0.0.1:\(leaving)"), "\(nodes())")
        let owned = ports.filter { $0 == leaving }.count
        try await onOwnThread { Result { try cluster.reshard(from: leaving, to: staying, slots: owned) } }.get()
        try await waitUntil(timeout: .seconds(30)) {
            await client.refreshTopology()
            return !nodes().contains("127.0.0.1:\(leaving)")
        }
        #expect(nodes().contains("127.0.0.1:\(staying)"))
        #expect(!metrics.counters.contains { $0.label == "apns_relay_redis_node_errors_total" && $0.dimensions.contains { $0.1 == "127.0.0.1:\(leaving)" } })
        await client.shutdown()
    }

    static func otherMaster(than port: Int, in cluster: RedisClusterProcess) -> Int {
        cluster.servers.prefix(cluster.masters).first { $0.port != port }!.port
    }

    @Test func aMovedSlotIsFollowedAndTheMapRead() async throws {
        let cluster = try await startCluster()
        let key = "moving-\(UUID().uuidString)", slot = RedisHashSlot.of(key)
        try await withClusterClient(cluster.url) { client in
            #expect(try await client.send(RedisCommand("SET", [key, "before"])) == .status("OK"))
            let source = try #require(try await offPool { try cluster.masterPort(forSlot: slot) })
            try await Self.move(slot, of: cluster, to: Self.otherMaster(than: source, in: cluster), keys: [key])
            // The client's map still names the old master: MOVED, then the new one answers.
            #expect(try await client.send(RedisCommand("GET", [key])) == .bulk(Array("before".utf8)))
            // The MOVED started a map read (the command went to the named node meanwhile, and
            // may be answered before the read's task began).
            #expect(client.clusterCounters.moved == 1)
            try await waitUntil { client.clusterCounters.refreshes >= 2 }
            await client.refreshTopology()
            // The map was read again: no redirect from now on.
            #expect(try await client.send(RedisCommand("SET", [key, "after"])) == .status("OK"))
            #expect(client.clusterCounters.moved == 1)
        }
    }

    @Test func aSlotHalfWayIsAskedOfItsNewNodeWithoutChangingTheMap() async throws {
        let cluster = try await startCluster()
        let moved = "{half}-moved", staying = "{half}-staying", slot = RedisHashSlot.of("half")
        try await withClusterClient(cluster.url) { client in
            _ = try await client.pipeline([RedisCommand("SET", [moved, "m"]), RedisCommand("SET", [staying, "s"])])
            let source = try #require(try await offPool { try cluster.masterPort(forSlot: slot) })
            try await Self.move(slot, of: cluster, to: Self.otherMaster(than: source, in: cluster), keys: [moved], finish: false)
            // One key left the migrating node: ASK for it, the other is still answered where it was.
            let replies = try await client.pipeline([RedisCommand("GET", [moved]), RedisCommand("GET", [staying])])
            #expect(replies == [.bulk(Array("m".utf8)), .bulk(Array("s".utf8))])
            #expect(client.clusterCounters.ask == 1 && client.clusterCounters.moved == 0 && client.clusterCounters.refreshes == 1)
            #expect(client.nodes.count == 3)
        }
    }

    /// A write asked of a slot's new node (`ASK`) takes its call's `WAIT` along: the new node
    /// runs it after the write (its `cmdstat_wait`), so the replicas it counts are the write's.
    @Test func aWaitGoesWithItsWriteWhenTheWriteIsRedirected() async throws {
        let cluster = try await startCluster()
        let key = "{waited}-key", slot = RedisHashSlot.of("waited")
        try await withClusterClient(cluster.url) { client in
            _ = try await client.send(RedisCommand("SET", [key, "1"]))
            let source = try #require(try await offPool { try cluster.masterPort(forSlot: slot) })
            let target = Self.otherMaster(than: source, in: cluster)
            try await Self.move(slot, of: cluster, to: target, keys: [key], finish: false)
            func waits(on port: Int) async throws -> Int {
                let node = try RedisClientTests.client("redis://127.0.0.1:\(port)/0")
                let info = try await node.send(RedisCommand("INFO", ["commandstats"])).string ?? ""
                await node.shutdown()
                let line = info.split(whereSeparator: \.isNewline).first { $0.hasPrefix("cmdstat_wait:") } ?? ""
                return Int(line.split(separator: "=").dropFirst().first?.split(separator: ",").first ?? "0") ?? 0
            }
            let before = try await waits(on: target)
            let replies = try await client.pipeline([RedisCommand("SET", [key, "2"]), RedisCommand("WAIT", [0, 100])])
            #expect(replies == [.status("OK"), .integer(0)])
            #expect(client.clusterCounters.ask == 1)
            #expect(try await waits(on: target) == before + 1)
        }
    }

    @Test func aFailedMastersSlotsAreServedByItsReplicaWithinTheDeadline() async throws {
        let cluster = try await startCluster(replicasPerMaster: 1, nodeTimeoutMilliseconds: 1000)
        let key = "failover-\(UUID().uuidString)", slot = RedisHashSlot.of(key)
        try await withClusterClient(cluster.url, timeout: .seconds(10)) { client in
            let written = try await client.pipeline([RedisCommand("SET", [key, "kept"]), RedisCommand("WAIT", [1, 2000])])
            #expect(written == [.status("OK"), .integer(1)], "the replica has the key before its master dies")
            let master = try #require(try await offPool { try cluster.masterPort(forSlot: slot) })
            try await offPool { cluster.servers.first { $0.port == master }!.stop() }
            // Refused connections, then CLUSTERDOWN until the replica took over: the call waits.
            // A command written before the client saw its connection close fails with it (it
            // may have run): on a loaded machine the GET can be that command, and it is asked
            // once more, as the relay's own retries do.
            let kept: RESPValue
            do {
                kept = try await client.send(RedisCommand("GET", [key]))
            } catch RedisError.connectionLost {
                kept = try await client.send(RedisCommand("GET", [key]))
            }
            #expect(kept == .bulk(Array("kept".utf8)), "\(kept)")
            #expect(!client.nodes.contains(RedisNodeAddress(host: "127.0.0.1", port: master)))
            #expect(client.nodes.count == 3)
        }
    }

    @Test func aClusterThatIsDownFailsCallsByTheirDeadline() async throws {
        let cluster = try await startCluster(nodeTimeoutMilliseconds: 1000)
        try await withClusterClient(cluster.url, timeout: .seconds(3)) { client in
            _ = try await client.send(RedisCommand("SET", ["up", "1"]))
            try await offPool { for server in cluster.servers.prefix(2) { server.stop() } }
            // A connection to a stopped server can still look open for a moment: a call written
            // on it fails at once with `connectionLost` (its commands may have run, so it is not
            // sent again). The call timed is the first of up to three that did not fail so.
            var elapsed = Duration.zero
            var error: RedisError?
            for _ in 0..<3 {
                let started = ContinuousClock.now
                error = await #expect(throws: RedisError.self) {
                    _ = try await client.pipeline((0..<30).map { RedisCommand("GET", ["down-\($0)"]) })
                }
                elapsed = ContinuousClock.now - started
                guard case .connectionLost? = error, elapsed < .milliseconds(500) else { break }
            }
            // The unreachable masters' commands are sent again until no backoff (400 ms at most
            // here) fits before the deadline, and never past it.
            #expect(elapsed >= .milliseconds(2_500) && elapsed < .milliseconds(3_300), "\(elapsed) \(String(describing: error))")
        }
    }
}

/// The test clusters' bookkeeping command, against a real redis-server: replies read as
/// `redis-cli` prints them off a terminal, and a node that is not there is an error, not an
/// empty answer.
@Suite("Loopback Redis command (test tooling)", .timeLimit(.minutes(1)))
struct LoopbackRedisCommandTests {
    @Test func repliesReadAsRedisCLIPrintsThem() async throws {
        let server = try await RedisServerProcess.started()
        let port = server.port
        try await offPool {
            #expect(try LoopbackRedisCommand.run(port: port, ["SET", "k", "a\nb"]) == "OK\n")
            #expect(try LoopbackRedisCommand.run(port: port, ["GET", "k"]) == "a\nb\n")
            #expect(try LoopbackRedisCommand.run(port: port, ["GET", "missing"]) == "\n")
            #expect(try LoopbackRedisCommand.run(port: port, ["RPUSH", "l", "x", "", "z"]) == "3\n")
            #expect(try LoopbackRedisCommand.run(port: port, ["LRANGE", "l", "0", "-1"]) == "x\n\nz\n")
            // Nested arrays come out flat, one element per line.
            let nested = try LoopbackRedisCommand.run(port: port, ["EVAL", "return {1, {'two', 3}}", "0"])
            #expect(nested == "1\ntwo\n3\n")
            #expect(try LoopbackRedisCommand.run(port: port, ["NOSUCHCOMMAND"]).hasPrefix("ERR unknown command"))
            // A reply larger than one read.
            let large = String(repeating: "v", count: 100_000)
            _ = try LoopbackRedisCommand.run(port: port, ["SET", "large", large])
            #expect(try LoopbackRedisCommand.run(port: port, ["GET", "large"]) == large + "\n")
            server.stop()
            #expect(throws: LoopbackRedisCommand.Failed.self) { try LoopbackRedisCommand.run(port: port, ["PING"]) }
        }
    }
}

/// A call's rounds over a Redis Cluster (``RedisClusterCall``), without a server: each node's
/// answer in, the next step out.
@Suite("Redis Cluster: a call's rounds (no server)")
struct RedisClusterCallTests {
    let a = RedisNodeAddress(host: "10.0.0.1", port: 7000)
    let b = RedisNodeAddress(host: "10.0.0.2", port: 7000)
    let c = RedisNodeAddress(host: "10.0.0.3", port: 7000)

    @Test func oneRoundAnswersTheCallInOrder() {
        var call = RedisClusterCall(everyNode: [false, false, false], maxRedirects: 5)
        let countedA = call.answered([0, 2], asking: false, from: a, .success([.integer(1), .status("OK")]))
        #expect(!countedA)
        let countedB = call.answered([1], asking: false, from: b, .success([.error("WRONGTYPE x")]))
        #expect(countedB, "an error reply counts for its node")
        let next = call.roundEnded()
        #expect(next == .replies([.integer(1), .error("WRONGTYPE x"), .status("OK")]))
    }

    /// N2: in a batch over two nodes, one key's slot half-way through a migration holds up that
    /// command only; the others keep their replies, and the call's `WAIT` goes again with it.
    @Test func aSlotBeingMigratedHoldsUpOnlyItsOwnCommands() {
        var call = RedisClusterCall(everyNode: [false, false, false, true], maxRedirects: 5)
        _ = call.answered([0, 3], asking: false, from: a, .success([.integer(1), .integer(1)]))
        _ = call.answered([1, 2, 3], asking: false, from: b,
                          .success([.error("TRYAGAIN Multiple keys request during rehashing of slot"), .integer(7), .integer(1)]))
        guard case .resend(let resend) = call.roundEnded() else { Issue.record("no resend"); return }
        #expect(resend == .init(toOwners: [1, 3], readMap: .no, backoffAttempt: 0))
        call.resent()
        _ = call.answered([1, 3], asking: false, from: b, .success([.integer(5), .integer(0)]))
        // The WAIT's replies merge to the weakest: the resent write's node had no replica.
        let next = call.roundEnded()
        #expect(next == .replies([.integer(1), .integer(5), .integer(7), .integer(0)]))
    }

    @Test func aMovedSlotIsResentToItsNewOwnerWhileTheMapIsRead() {
        var call = RedisClusterCall(everyNode: [false, true], maxRedirects: 5)
        _ = call.answered([0, 1], asking: false, from: a, .success([.error("MOVED 3999 10.0.0.3:7000"), .integer(1)]))
        let next = call.roundEnded()
        #expect(next == .resend(.init(moved: [c: [0, 1]], readMap: .meanwhile, moves: 1)))
    }

    @Test func anAskGoesToItsNodeOnceAndLeavesTheMap() {
        var call = RedisClusterCall(everyNode: [false, false], maxRedirects: 5)
        _ = call.answered([0, 1], asking: false, from: a, .success([.error("ASK 3999 10.0.0.2:7000"), .integer(2)]))
        let next = call.roundEnded()
        #expect(next == .resend(.init(asked: [b: [0]], readMap: .no, asks: 1)))
        call.resent()
        // Each command after an ASKING: the ASKING's reply is skipped.
        _ = call.answered([0], asking: true, from: b, .success([.status("OK"), .integer(9)]))
        let nextAgain = call.roundEnded()
        #expect(nextAgain == .replies([.integer(9), .integer(2)]))
    }

    /// A node that refused the connection: its commands were never written; the map is read
    /// before they go to whoever owns their slots then, and from the second round after a
    /// backoff. A call that cannot go on fails with the refusal.
    @Test func anUnreachableNodesCommandsWaitForTheMap() {
        var call = RedisClusterCall(everyNode: [false, false], maxRedirects: 5)
        let refused = RedisError.unavailable("connection refused")
        let counted = call.answered([0], asking: false, from: a, .failure(refused))
        #expect(counted)
        _ = call.answered([1], asking: false, from: b, .success([.integer(3)]))
        let next = call.roundEnded()
        #expect(next == .resend(.init(toOwners: [0], readMap: .first)))
        call.resent()
        _ = call.answered([0], asking: false, from: a, .failure(refused))
        let nextAgain = call.roundEnded()
        #expect(nextAgain == .resend(.init(toOwners: [0], readMap: .first, backoffAttempt: 1)))
        #expect(call.gaveUp() == .failed(refused))
    }

    /// At most `maxRedirects` rounds of MOVED or ASK: then the command keeps its redirect as its
    /// reply. TRYAGAIN rounds do not count (the deadline bounds them).
    @Test func redirectsAreBounded() {
        var call = RedisClusterCall(everyNode: [false], maxRedirects: 2)
        _ = call.answered([0], asking: false, from: a, .success([.error("TRYAGAIN later")]))
        guard case .resend = call.roundEnded() else { Issue.record("no resend after TRYAGAIN"); return }
        for round in 1...3 {
            call.resent()
            _ = call.answered([0], asking: false, from: a, .success([.error("MOVED 1 10.0.0.2:7000")]))
            let next = call.roundEnded()
            if round < 3 {
                #expect(next == .resend(.init(moved: [b: [0]], readMap: .meanwhile, moves: 1)))
            } else {
                #expect(next == .replies([.error("MOVED 1 10.0.0.2:7000")]))
            }
        }
    }

    @Test func aLostConnectionOrAMiscountFailsTheCall() {
        var lost = RedisClusterCall(everyNode: [false, false], maxRedirects: 5)
        let counted = lost.answered([0], asking: false, from: a, .failure(.connectionLost("reset")))
        #expect(counted)
        let countedAgain = lost.answered([1], asking: false, from: b, .failure(.unavailable("refused")))
        #expect(countedAgain, "counted against its node, and otherwise ignored after the failure")
        let next = lost.roundEnded()
        #expect(next == .failed(.connectionLost("reset")))
        var miscount = RedisClusterCall(everyNode: [false, false], maxRedirects: 5)
        _ = miscount.answered([0, 1], asking: false, from: a, .success([.integer(1)]))
        let nextAgain = miscount.roundEnded()
        #expect(nextAgain == .failed(.protocolError("1 replies to 2 commands")))
    }
}
