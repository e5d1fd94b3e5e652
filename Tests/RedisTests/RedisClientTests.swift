import Common
import Foundation
import NIOCore
import NIOPosix
import Redis
import Testing
import Spawn
import RedisTesting
import TestSupport

@Suite("Redis URLs", .timeLimit(.minutes(3)))
struct RedisURLTests {
    @Test func parsesEveryPart() throws {
        let plain = try RedisURL(parsing: "redis://127.0.0.1:6380/2")
        #expect(plain == RedisURL(host: "127.0.0.1", port: 6380, database: 2))
        let defaults = try RedisURL(parsing: "redis://cache.internal")
        #expect(defaults.port == 6379 && defaults.database == 0 && defaults.password == nil && !defaults.tls)
        let secret = try RedisURL(parsing: "rediss://:p%40ss@cache:6379/0")
        #expect(secret.password == "p@ss" && secret.username == nil && secret.tls)
        let acl = try RedisURL(parsing: "redis://relay:hunter2@cache/1")
        #expect(acl.username == "relay" && acl.password == "hunter2" && acl.database == 1)
        #expect(!acl.description.contains("hunter2"))
        #expect(acl.description == "redis://relay:<redacted>@cache:6379/1")
    }

    @Test func rejectsWhatIsNotARedisURL() {
        for bad in ["http://cache:6379", "redis://", "redis://cache:0", "redis://cache:6379/x", "redis://cache/-1", "cache:6379"] {
            #expect(throws: RedisError.self, "\(bad)") { try RedisURL(parsing: bad) }
        }
    }
}

@Suite("Redis client against redis-server", .timeLimit(.minutes(3)))
struct RedisClientTests {
    static func client(_ url: String, timeout: Duration = .seconds(2), connections: Int = 2) throws -> RedisClient {
        var configuration = RedisConfiguration(url: try RedisURL(parsing: url))
        configuration.commandTimeout = timeout
        configuration.connections = connections
        configuration.reconnectBackoff = Backoff(base: .milliseconds(20), maximum: .milliseconds(200))
        return try RedisClient(configuration: configuration)
    }

    @Test func commandsAndReplies() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        let binary: [UInt8] = [0, 1, 0xFF, 13, 10, 36]
        #expect(try await client.send(RedisCommand("SET", ["bin", binary])) == .status("OK"))
        #expect(try await client.send(RedisCommand("GET", ["bin"])) == .bulk(binary))
        #expect(try await client.send(RedisCommand("GET", ["missing"])) == .null)
        #expect(try await client.send(RedisCommand("INCRBY", ["n", 5])) == .integer(5))
        #expect(try await client.send(RedisCommand("RPUSH", ["list", "a", "b"])) == .integer(2))
        #expect(try await client.send(RedisCommand("LRANGE", ["list", 0, -1])) == .array([.bulk(Array("a".utf8)), .bulk(Array("b".utf8))]))
        await #expect(throws: RedisError.self) { try await client.send(RedisCommand("INCR", ["list"])) }
        await client.shutdown()
    }

    /// A call made after the client shut down (its own event loop group with it) fails at once
    /// with `shutdown`, awaited or heard on a loop of the caller's: its failure is not left on a
    /// loop that no longer runs anything, where it would never be heard.
    @Test(.timeLimit(.minutes(1))) func aCallAfterShutdownFailsAtOnce() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        #expect(try await client.send(RedisCommand("PING", [])) == .status("PONG"))
        await client.shutdown()
        await #expect(throws: RedisError.shutdown) { try await client.send(RedisCommand("PING", [])) }
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let heard = try await loop.submit {
            let promise = loop.makePromise(of: Result<[RESPValue], RedisError>.self)
            var commands = RedisCommandBuffer()
            commands.append(RedisCommand("PING", []))
            client.submit(commands, ordered: false).whenComplete(on: loop) { promise.succeed($0) }
            return promise.futureResult
        }.get().get()
        #expect(throws: RedisError.shutdown) { try heard.get() }
    }

    /// A replica's full sync writes its master's snapshot (`dump.rdb`) into its directory, and
    /// every redis-server loads the one it finds in its directory at start: a server started
    /// after another's sync starts empty, because each has a directory of its own. (With one
    /// directory for all, it started with the replica's data: keys of one test in another's.)
    @Test func aServerStartedAfterAReplicasSyncStartsEmpty() async throws {
        let master = try await RedisServerProcess.started()
        let client = try Self.client(master.url)
        #expect(try await client.send(RedisCommand("SET", ["synced", "1"])) == .status("OK"))
        let replica = try await RedisServerProcess.started(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"])
        let replicaClient = try Self.client(replica.url)
        try await waitUntil(timeout: .seconds(30), asking: {
            ((try? await replicaClient.send(RedisCommand("INFO", ["replication"])))?.string ?? "").contains("master_link_status:up")
        })
        let fresh = try await RedisServerProcess.started()
        let freshClient = try Self.client(fresh.url)
        #expect(try await freshClient.send(RedisCommand("DBSIZE", [])) == .integer(0))
        for client in [client, replicaClient, freshClient] { await client.shutdown() }
    }

    @Test func commandsBuiltInPiecesIntoOneBufferAreSentAsWritten() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        let numbers: [Int64] = [0, 7, -1, 1_795_329_384_604, Int64.max, Int64.min]
        var buffer = RedisCommandBuffer(reservingBytes: 16)
        for (index, number) in numbers.enumerated() {
            buffer.append("SET") { command in
                command.appendArgument { $0.append(contentsOf: "key:{".utf8); $0.append(contentsOf: "\(index)".utf8); $0.append(UInt8(ascii: "}")) }
                command.append(number)
            }
        }
        buffer.append(RedisCommand("MGET", numbers.indices.map { "key:{\($0)}" }))
        #expect(buffer.count == numbers.count + 1)
        let replies = try await client.pipeline(buffer)
        #expect(replies.prefix(numbers.count).allSatisfy { $0 == .status("OK") })
        #expect(replies.last?.array?.map(\.string) == numbers.map { "\($0)" })
        await client.shutdown()
    }

    @Test func aPipelineIsOneRoundTripWithRepliesInOrder() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        let commands = (0..<1000).map { RedisCommand("SET", ["k\($0)", $0]) } + (0..<1000).map { RedisCommand("GET", ["k\($0)"]) }
            + [RedisCommand("HGET", ["k1", "x"])]
        let replies = try await client.pipeline(commands)
        #expect(replies.count == 2001)
        #expect(replies[0..<1000].allSatisfy { $0 == .status("OK") })
        #expect(replies[1000..<2000].enumerated().allSatisfy { $0.element.integer == Int64($0.offset) })
        guard case .error(let message) = replies[2000] else {
            Issue.record("expected WRONGTYPE, got \(replies[2000])")
            return
        }
        #expect(message.hasPrefix("WRONGTYPE"))
        await client.shutdown()
    }

    @Test func concurrentCallersAllGetTheirOwnAnswers() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<200 {
                group.addTask {
                    let key = "c\(index)"
                    _ = try await client.send(RedisCommand("SET", [key, index]))
                    #expect(try await client.send(RedisCommand("GET", [key])).integer == Int64(index))
                }
            }
            try await group.waitForAll()
        }
        await client.shutdown()
    }

    @Test func scriptsRunBySHAAndAreLoadedAgainAfterAFlush() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url)
        let script = RedisScript("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        #expect(try await client.evaluate(script, keys: ["s"], arguments: [2]) == .integer(2))
        #expect(try await client.send(RedisCommand("SCRIPT", ["EXISTS", script.sha1])) == .array([.integer(1)]))
        _ = try await client.send(RedisCommand("SCRIPT", ["FLUSH"]))
        #expect(try await client.evaluate(script, keys: ["s"], arguments: [3]) == .integer(5))
        let broken = RedisScript("return redis.call('NOPE')")
        await #expect(throws: RedisError.self) { try await client.evaluate(broken, keys: [], arguments: []) }
        await client.shutdown()
    }

    @Test func authAndDatabaseFromTheURL() async throws {
        let server = try await RedisServerProcess.started(arguments: ["--requirepass", "s3cret-pw"])
        let client = try Self.client("redis://:s3cret-pw@127.0.0.1:\(server.port)/3")
        _ = try await client.send(RedisCommand("SET", ["where", "db3"]))
        let other = try Self.client("redis://:s3cret-pw@127.0.0.1:\(server.port)/0")
        #expect(try await other.send(RedisCommand("GET", ["where"])) == .null)
        #expect(try await other.send(RedisCommand("SELECT", [3])) == .status("OK"))
        await other.shutdown()

        let wrong = try Self.client("redis://:wrong-pw@127.0.0.1:\(server.port)/0")
        do {
            _ = try await wrong.send(RedisCommand("PING"))
            Issue.record("a wrong password was accepted")
        } catch {
            guard case .unavailable(let why) = error else {
                Issue.record("expected unavailable, got \(error)")
                return
            }
            #expect(!why.contains("wrong-pw"))
        }
        await wrong.shutdown()
        await client.shutdown()
    }

    @Test func redissSpeaksTLS() async throws {
        let directory = TestFiles.path("redis-tls-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let certificate = directory.appendingPathComponent("cert.pem").path, key = directory.appendingPathComponent("key.pem").path
        let quiet = open("/dev/null", O_WRONLY)
        defer { close(quiet) }
        let openssl = try ChildProcess(executable: "/usr/bin/openssl", arguments: [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", certificate,
        ], standardError: quiet)
        try #require(openssl.wait() == 0)
        let server = try await RedisServerProcess.started(tls: (certificate, key))
        #expect(server.url.hasPrefix("rediss://"))
        var configuration = RedisConfiguration(url: try RedisURL(parsing: server.url))
        // A self-signed test certificate: verification is what tlsSkipVerify turns off.
        configuration.tlsSkipVerify = true
        let client = try RedisClient(configuration: configuration)
        #expect(try await client.send(RedisCommand("SET", ["over", "tls"])) == .status("OK"))
        #expect(try await client.send(RedisCommand("GET", ["over"])) == .bulk(Array("tls".utf8)))
        await client.shutdown()
        // Verification on (the default): the self-signed certificate is refused.
        let verifying = try RedisClient(configuration: RedisConfiguration(url: try RedisURL(parsing: server.url)))
        await #expect(throws: RedisError.self) { try await verifying.send(RedisCommand("PING")) }
        await verifying.shutdown()
        // Plain RESP to the TLS port gets no answer it can read.
        let plain = try Self.client("redis://127.0.0.1:\(server.port)/0", timeout: .milliseconds(500))
        await #expect(throws: RedisError.self) { try await plain.send(RedisCommand("PING")) }
        await plain.shutdown()
    }

    /// A Redis with a certificate from a private CA that asks clients for certificates
    /// (`tls-auth-clients yes`): the CA file verifies it, the client certificate is accepted;
    /// without the client certificate, or without the CA, no call goes through.
    @Test func rediss_withAPrivateCAAndAClientCertificate() async throws {
        let directory = TestFiles.path("redis-mtls-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }
        func openssl(_ arguments: [String]) throws {
            let quiet = open("/dev/null", O_WRONLY)
            defer { close(quiet) }
            let run = try ChildProcess(executable: "/usr/bin/openssl", arguments: arguments, standardError: quiet)
            try #require(run.wait() == 0, "openssl \(arguments)")
        }
        let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        try openssl(["req", "-x509"] + curve + ["-days", "1", "-subj", "/CN=test-ca", "-keyout", path("ca.key"), "-out", path("ca.pem")])
        try "subjectAltName=IP:127.0.0.1\n".write(toFile: path("server.ext"), atomically: true, encoding: .utf8)
        try "extendedKeyUsage=clientAuth\n".write(toFile: path("client.ext"), atomically: true, encoding: .utf8)
        for (name, subject) in [("server", "/CN=127.0.0.1"), ("client", "/CN=relay")] {
            try openssl(["req"] + curve + ["-subj", subject, "-keyout", path("\(name).key"), "-out", path("\(name).csr")])
            try openssl(["x509", "-req", "-in", path("\(name).csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"), "-CAcreateserial",
                         "-days", "1", "-extfile", path("\(name).ext"), "-out", path("\(name).pem")])
        }
        let server = try await RedisServerProcess.started(arguments: ["--tls-auth-clients", "yes", "--tls-ca-cert-file", path("ca.pem")],
                                                          tls: (path("server.pem"), path("server.key")))
        func client(ca: Bool, certificate: Bool) throws -> RedisClient {
            var configuration = RedisConfiguration(url: try RedisURL(parsing: server.url))
            configuration.commandTimeout = .seconds(2)
            if ca { configuration.tlsCAFile = path("ca.pem") }
            if certificate { configuration.tlsClientCertificate = (path("client.pem"), path("client.key")) }
            return try RedisClient(configuration: configuration)
        }
        let verified = try client(ca: true, certificate: true)
        #expect(try await verified.send(RedisCommand("SET", ["over", "mtls"])) == .status("OK"))
        await verified.shutdown()
        for (ca, certificate) in [(true, false), (false, true)] {
            let refused = try client(ca: ca, certificate: certificate)
            await #expect(throws: RedisError.self, "CA \(ca), client certificate \(certificate)") { try await refused.send(RedisCommand("PING")) }
            await refused.shutdown()
        }
    }

    @Test func aLateAnswerFailsAtTheDeadlineAndTheNextCallWorks() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url, timeout: .milliseconds(300), connections: 1)
        let started = ContinuousClock.now
        // BLPOP would block 30 s; the 300 ms deadline ends the call long before (generous bound:
        // the suite runs many tests at once on two cores).
        await #expect(throws: RedisError.timedOut) { try await client.send(RedisCommand("BLPOP", ["empty", 30])) }
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .milliseconds(300) && elapsed < .seconds(10), "\(elapsed)")
        #expect(try await client.send(RedisCommand("PING")) == .status("PONG"))
        await client.shutdown()
    }

    @Test func unreachableRedisFailsFastNamingWhere() async throws {
        let port = try RedisServerProcess.freePort()
        // A 30 s command deadline: "fast" means a refused connection fails the call long before
        // it (a generous bound: the suite runs many tests at once on two cores).
        let client = try Self.client("redis://127.0.0.1:\(port)/0", timeout: .seconds(30))
        let started = ContinuousClock.now
        do {
            _ = try await client.send(RedisCommand("PING"))
            Issue.record("nothing listens there")
        } catch {
            #expect("\(error)".contains("127.0.0.1:\(port)"))
            guard case .unavailable = error else { Issue.record("\(error) is not RedisError.unavailable"); return }
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        await client.shutdown()
    }

    @Test func reconnectsAfterARedisRestart() async throws {
        let server = try await RedisServerProcess.started()
        let client = try Self.client(server.url, connections: 1)
        #expect(try await client.send(RedisCommand("PING")) == .status("PONG"))
        server.stop()
        await #expect(throws: RedisError.self) { try await client.send(RedisCommand("PING")) }
        try await server.restart()
        // Calls fail fast while the connection's backoff runs (at most 200 ms here), then the
        // client connects again by itself.
        var answer: RESPValue?
        let giveUp = ContinuousClock.now + .seconds(10)
        while answer == nil, ContinuousClock.now < giveUp {
            do {
                answer = try await client.send(RedisCommand("PING"))
            } catch {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        #expect(answer == .status("PONG"))
        await client.shutdown()
    }
}
