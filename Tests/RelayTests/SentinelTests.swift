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
