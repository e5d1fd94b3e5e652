import Foundation
import Spawn

/// A private Redis Cluster on free loopback ports: `masters` redis-servers in cluster mode
/// (and `replicasPerMaster` replicas of each), joined with `redis-cli --cluster create`, slots
/// spread evenly. For the tests and the benchmark. Its servers are killed when released.
public final class RedisClusterProcess: Sendable {
    /// Every node; the first `masters` were created as masters.
    public let servers: [RedisServerProcess]
    public let masters: Int
    private let directory: URL

    /// A seed node's URL (the first master).
    public var url: String { "redis://127.0.0.1:\(servers[0].port)/0" }

    /// - Parameter nodeTimeoutMilliseconds: `cluster-node-timeout`: how long a master may be
    ///   unreachable before its replica takes over.
    public init(masters: Int = 3, replicasPerMaster: Int = 0, nodeTimeoutMilliseconds: Int = 2000) throws {
        precondition(masters >= 3, "redis-cli --cluster create needs at least three masters")
        self.masters = masters
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("redis-cluster-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var servers: [RedisServerProcess] = []
        for index in 0..<(masters * (1 + replicasPerMaster)) {
            // The cluster bus gets a free port of its own (port + 10000 may be out of range),
            // picked again when something else took it before the node bound it (the node's own
            // port is picked again by RedisServerProcess).
            var attempt = 1
            while true {
                do {
                    servers.append(try RedisServerProcess(arguments: [
                        // Each node's snapshot file its own (a replica's full sync writes one,
                        // and a node loads the one it finds when it starts).
                        "--cluster-enabled", "yes", "--cluster-config-file", "nodes-\(index).conf", "--dbfilename", "dump-\(index).rdb",
                        "--cluster-node-timeout", "\(nodeTimeoutMilliseconds)", "--cluster-port", "\(try RedisServerProcess.freePort())",
                        // A replica takes over however long ago it last heard from its master.
                        "--cluster-replica-validity-factor", "0",
                        "--dir", directory.path,
                    ]))
                    break
                } catch let failure as RedisServerProcess.ServerFailed where failure.log.contains("(cluster), aborting") && attempt < 5 {
                    attempt += 1
                    try? FileManager.default.removeItem(at: directory.appendingPathComponent("nodes-\(index).conf"))
                }
            }
        }
        self.servers = servers
        let create = try ChildProcess.capturingOutput(
            executable: try Self.redisCLI(),
            arguments: ["--cluster", "create"] + servers.map { "127.0.0.1:\($0.port)" }
                + ["--cluster-replicas", "\(replicasPerMaster)", "--cluster-yes"])
        // readToEnd closes the descriptor.
        let log = String(decoding: ChildProcess.readToEnd(create.output), as: UTF8.self)
        guard create.process.wait() == 0, log.contains("All 16384 slots covered") else {
            throw RedisServerProcess.ServerFailed(log: "redis-cli --cluster create failed:\n\(log)")
        }
        try waitUntilConsistent()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// Kills every node (SIGKILL).
    public func stop() {
        for server in servers { server.stop() }
    }

    /// Waits (20 s at most) until every running node says `cluster_state:ok` and agrees on the
    /// slot map, and every replica is in sync with its master: after creating the cluster, a
    /// failover or a reshard.
    public func waitUntilConsistent() throws {
        let deadline = Date().addingTimeInterval(20)
        var last = ""
        while Date() < deadline {
            var views: Set<String> = []
            var ok = true
            var unanswered: [String] = []
            for server in servers where server.isRunning {
                do {
                    let info = try cli(port: server.port, ["CLUSTER", "INFO"])
                    if !info.contains("cluster_state:ok") { ok = false }
                    // A replica counts once it finished syncing with its master.
                    let replication = try cli(port: server.port, ["INFO", "replication"])
                    if replication.contains("role:slave"), !replication.contains("master_link_status:up") { ok = false }
                    views.insert(try cli(port: server.port, ["CLUSTER", "SLOTS"]).split(separator: "\n").sorted().joined(separator: ","))
                } catch {
                    // A node that does not answer (yet) is not settled.
                    ok = false
                    unanswered.append("\(error)")
                }
            }
            if ok && views.count == 1 { return }
            last = "states ok: \(ok), distinct slot maps: \(views.count)" + (unanswered.isEmpty ? "" : ", \(unanswered.joined(separator: "; "))")
            // No event to await: the nodes gossip on their own schedule.
            Thread.sleep(forTimeInterval: 0.1)
        }
        throw RedisServerProcess.ServerFailed(log: "the Redis Cluster did not settle in 20 s (\(last))")
    }

    /// Sends one command to the node on `port` and returns its reply as `redis-cli -p port
    /// args...` prints it (see ``LoopbackRedisCommand``); throws when the node does not answer.
    @discardableResult
    public func cli(port: Int, _ arguments: [String]) throws -> String {
        try LoopbackRedisCommand.run(port: port, arguments)
    }

    /// Per slot, the port of the master serving it now (0: none), as the first running node
    /// sees it (`CLUSTER NODES`: `<id> <ip:port@bus> <flags> <master> ... <slot ranges>`).
    public func masterPorts() throws -> [Int] {
        var ports = [Int](repeating: 0, count: 16_384)
        guard let server = servers.first(where: \.isRunning) else { return ports }
        for line in try cli(port: server.port, ["CLUSTER", "NODES"]).split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 8, fields[2].contains("master"), !fields[2].contains("fail"),
                  let address = fields[1].split(separator: "@").first, let colon = address.lastIndex(of: ":"),
                  let port = Int(address[address.index(after: colon)...]) else { continue }
            for range in fields[8...] where !range.hasPrefix("[") {
                let bounds = range.split(separator: "-").compactMap { Int($0) }
                guard let low = bounds.first, let high = bounds.last, low <= high, high < ports.count else { continue }
                for slot in low...high { ports[slot] = port }
            }
        }
        return ports
    }

    /// The port of the master serving `slot` now (see ``masterPorts()``).
    public func masterPort(forSlot slot: Int) throws -> Int? {
        let port = try masterPorts()[slot]
        return port == 0 ? nil : port
    }

    /// Moves `slots` slots, and their keys, from one master to another with `redis-cli --cluster
    /// reshard`, then waits until every node agrees.
    public func reshard(from source: Int, to target: Int, slots: Int) throws {
        let run = try ChildProcess.capturingOutput(executable: try Self.redisCLI(), arguments: [
            "--cluster", "reshard", "127.0.0.1:\(source)", "--cluster-from", try nodeID(port: source),
            "--cluster-to", try nodeID(port: target), "--cluster-slots", "\(slots)", "--cluster-yes",
        ])
        let log = String(decoding: ChildProcess.readToEnd(run.output), as: UTF8.self)
        guard run.process.wait() == 0 else {
            throw RedisServerProcess.ServerFailed(log: "redis-cli --cluster reshard failed:\n\(log.suffix(2000))")
        }
        try waitUntilConsistent()
    }

    /// A node's cluster id (`CLUSTER MYID`).
    public func nodeID(port: Int) throws -> String {
        try cli(port: port, ["CLUSTER", "MYID"]).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func redisCLI() throws -> String {
        for path in ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        throw RedisServerProcess.ServerFailed(log: "redis-cli is not installed (apt-get install redis-tools; the scripts install it)")
    }
}
