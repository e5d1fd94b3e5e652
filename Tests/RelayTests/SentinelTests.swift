import APNs
import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `redis.mode: sentinel` against a real master, replica and Sentinel: the relay finds the master
/// through the Sentinel, and after a failover goes on against the new one.
@Suite("Redis Sentinel", .stopsItsRelays, .timeLimit(.minutes(3)))
struct SentinelTests {
    /// Sends one command to a server or Sentinel on loopback.
    static func ask(_ port: Int, _ command: RedisCommand) async throws -> RESPValue {
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(host: "127.0.0.1", port: port)))
        defer { Task { await client.shutdown() } }
        return try await client.send(command)
    }

    static func masterPort(_ sentinel: RedisSentinelProcess) async throws -> Int? {
        let reply = try await ask(sentinel.port, RedisCommand("SENTINEL", ["GET-MASTER-ADDR-BY-NAME", sentinel.masterName]))
        return reply.array.flatMap { $0.count == 2 ? $0[1].string.flatMap { Int($0) } : nil }
    }

    @Test func aFailoverMovesTheRelayToTheNewMaster() async throws {
        let master = try await RedisServerProcess.started()
        let replica = try await RedisServerProcess.started(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"])
        // The replica in sync before the Sentinel starts: its first look at the master finds it.
        try await waitUntil(timeout: .seconds(30), asking: {
            let info = (try? await Self.ask(replica.port, RedisCommand("INFO", ["replication"])))?.string ?? ""
            return info.contains("master_link_status:up")
        })
        let sentinel = try await onOwnThread { Result { try RedisSentinelProcess(masterPort: master.port) } }.get()
        // The Sentinel knows the replica and would promote it.
        try await waitUntil(timeout: .seconds(30), asking: {
            let replicas = (try? await Self.ask(sentinel.port, RedisCommand("SENTINEL", ["REPLICAS", sentinel.masterName])))?.array ?? []
            return replicas.contains { entry in
                // Each replica: a flat list of field names and values.
                let values = (entry.array ?? []).map { $0.string ?? "" }
                let fields = Dictionary(stride(from: 0, to: values.count - 1, by: 2).map { (values[$0], values[$0 + 1]) }) { first, _ in first }
                return fields["port"] == "\(replica.port)" && fields["flags"] == "slave" && fields["master-link-status"] == "ok"
            }
        })
        let harness = try await RelayHarness.start(configureRelay: {
            $0.redis.url = sentinel.url
            $0.redis.mode = .sentinel
            $0.policy.defaults.rateLimit = .init(burst: 10, refillPerSecond: 10)
            $0.policy.mailboxPollMilliseconds = 100
        })
        func produce(_ prefix: String) async throws {
            _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<40).map { index in
                let token = hexToken(0x5e00 + index)
                return (Array(token.utf8), Array(intent("\(prefix)-\(index)", token: token).utf8))
            })
        }
        try await produce("before")
        try await harness.published.waitUntil(timeout: .seconds(30)) { $0.count("delivered") == 40 }
        #expect(try await Self.masterPort(sentinel) == master.port)

        _ = try await Self.ask(sentinel.port, RedisCommand("SENTINEL", ["FAILOVER", sentinel.masterName]))
        try await waitUntil(timeout: .seconds(30), asking: { (try? await Self.masterPort(sentinel)) == replica.port })
        // The old master, alive, still takes writes until the Sentinel makes it a replica: the
        // relay's check of the Sentinels (every second) moves it first.
        try await waitUntil(timeout: .seconds(10)) { harness.pipeline.redis?.nodes.map(\.port) == [replica.port] }
        try await produce("after")
        try await harness.published.waitUntil(timeout: .seconds(60)) { $0.count("delivered") == 80 }
        // Each once at APNs; the second round's dedupe records are on the new master.
        let accepted = harness.simulator.accepted.map(\.apnsID)
        #expect(accepted.count == 80 && Set(accepted).count == 80)
        let record = RedisKeys.standard.seen(token: hexToken(0x5e00), topic: "com.example.app", id: "after-0")
        try await waitUntil(timeout: .seconds(10), asking: { (try? await Self.ask(replica.port, RedisCommand("EXISTS", [record])))?.integer == 1 })
        _ = try await harness.stopExpectingOneOutcomeEach()
        sentinel.stop()
    }

    /// The master killed under load (`SIGKILL`, no failover asked) with two replicas: the
    /// Sentinel promotes one, the other follows it, the relay follows the Sentinel, and every
    /// intent is answered once. The intents parked before the kill (acknowledged by a replica,
    /// `redis.park_min_replicas: 1`) are kept and go out from the new master; the intents
    /// produced during the failover wait for it. A park after the failover has the replica it
    /// asks for (without one it is refused NOREPLICAS, an outage, and waits).
    @Test func aMasterKilledUnderLoadKeepsItsParks() async throws {
        let master = try await RedisServerProcess.started()
        let replicas = [try await RedisServerProcess.started(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"]),
                        try await RedisServerProcess.started(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"])]
        for replica in replicas {
            try await waitUntil(timeout: .seconds(30), asking: {
                ((try? await Self.ask(replica.port, RedisCommand("INFO", ["replication"])))?.string ?? "").contains("master_link_status:up")
            })
        }
        let sentinel = try await onOwnThread { Result { try RedisSentinelProcess(masterPort: master.port) } }.get()
        try await waitUntil(timeout: .seconds(30), asking: {
            let known = (try? await Self.ask(sentinel.port, RedisCommand("SENTINEL", ["REPLICAS", sentinel.masterName])))?.array ?? []
            return replicas.allSatisfy { replica in known.contains { ($0.array ?? []).map { $0.string ?? "" }.contains("\(replica.port)") } }
        })
        // One token per 20 s: each device's second intent parks, and stays in its mailbox until
        // the master is killed (due sooner, on a loaded machine some were taken from the old
        // master before the kill, and taken again from the new one, which never had the take).
        let harness = try await RelayHarness.start(configureRelay: {
            $0.redis.url = sentinel.url
            $0.redis.mode = .sentinel
            $0.redis.parkMinReplicas = 1
            $0.policy.defaults.rateLimit = .init(burst: 1, refillPerSecond: 0.05)
            $0.policy.mailboxPollMilliseconds = 100
        })
        let devices = (0..<20).map { hexToken(0x5f00 + $0) }
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: devices.flatMap { token in
            ["sent", "parked"].map { (Array(token.utf8), Array(intent("\($0)-\(token.suffix(4))", token: token).utf8)) }
        })
        try await harness.published.waitUntil(timeout: .seconds(30)) { $0.count("delivered") == 20 }
        // Every parked intent is in its mailbox on the replicas too.
        for replica in replicas {
            try await waitUntil(timeout: .seconds(30), asking: {
                var parked = 0
                for token in devices {
                    let key = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
                    if (try? await Self.ask(replica.port, RedisCommand("HEXISTS", [key, "pid"])))?.integer == 1 { parked += 1 }
                }
                return parked == 20
            })
        }
        await onOwnThread { master.signal(SIGKILL) }
        // Traffic during the failover: one intent per new device.
        let others = (0..<20).map { hexToken(0x5f80 + $0) }
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: others.map { token in
            (Array(token.utf8), Array(intent("during-\(token.suffix(4))", token: token).utf8))
        })
        try await waitUntil(timeout: .seconds(30), asking: {
            let port = try? await Self.masterPort(sentinel)
            return replicas.contains { $0.port == port }
        })
        try await harness.published.waitUntil(timeout: slowed(.seconds(90))) { $0.count("delivered") == 60 }
        let accepted = harness.simulator.accepted.map(\.apnsID)
        #expect(accepted.count == 60 && Set(accepted).count == 60, "\(accepted.count) sent, \(Set(accepted).count) distinct")
        _ = try await harness.stopExpectingOneOutcomeEach()
        sentinel.stop()
    }

    /// A Sentinel that asks for a password (`requirepass`) and a master with its own: the
    /// relay's client authenticates to the Sentinel with `redis.sentinel_password` and to the
    /// master with the URL's password. Without the Sentinel's password it names the trouble.
    @Test func aSentinelWithAPasswordInFrontOfAMasterWithItsOwn() async throws {
        let master = try await RedisServerProcess.started(arguments: ["--requirepass", "m4ster"])
        let sentinel = try await onOwnThread {
            Result { try RedisSentinelProcess(masterPort: master.port, password: "s3ntinel", masterPassword: "m4ster") }
        }.get()
        var settings = RedisConfiguration(url: try RedisURL(parsing: "redis://:m4ster@127.0.0.1:\(sentinel.port)/0"))
        settings.mode = .sentinel
        settings.sentinelMaster = sentinel.masterName
        settings.commandTimeout = .seconds(2)
        let refused = try RedisClient(configuration: settings)
        do {
            _ = try await refused.send(RedisCommand("PING", []))
            Issue.record("a Sentinel that asks for a password answered without one")
        } catch {
            #expect("\(error)".contains("NOAUTH") && "\(error)".contains("\(sentinel.port)"), "\(error)")
        }
        settings.sentinelPassword = "s3ntinel"
        let client = try RedisClient(configuration: settings)
        #expect(try await client.send(RedisCommand("SET", ["k", "v"])).string == "OK")
        let direct = try RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: "redis://:m4ster@127.0.0.1:\(master.port)/0")))
        #expect(try await direct.send(RedisCommand("GET", ["k"])).string == "v")
        await refused.shutdown()
        await client.shutdown()
        await direct.shutdown()
        sentinel.stop()
    }

    /// A Sentinel that does not know the master's name is a Redis outage the relay names, not a
    /// crash or a connection to the Sentinel itself.
    @Test func anUnknownMasterNameIsNamedAsTheTrouble() async throws {
        let master = try await RedisServerProcess.started()
        let sentinel = try await onOwnThread { Result { try RedisSentinelProcess(masterPort: master.port) } }.get()
        var settings = RedisConfiguration(url: try RedisURL(parsing: sentinel.url))
        settings.mode = .sentinel
        settings.sentinelMaster = "nosuchmaster"
        settings.commandTimeout = .seconds(2)
        let client = try RedisClient(configuration: settings)
        await #expect(throws: RedisError.self) { _ = try await client.send(RedisCommand("PING", [])) }
        do {
            _ = try await client.send(RedisCommand("PING", []))
        } catch {
            #expect("\(error)".contains("nosuchmaster"), "\(error)")
        }
        settings.sentinelMaster = sentinel.masterName
        let good = try RedisClient(configuration: settings)
        #expect(try await good.send(RedisCommand("SET", ["k", "v"])).string == "OK")
        #expect(try await Self.ask(master.port, RedisCommand("GET", ["k"])).string == "v")
        await client.shutdown()
        await good.shutdown()
        sentinel.stop()
    }
}
