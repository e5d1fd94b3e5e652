import Common
import Redis
import RedisTesting
import Testing

/// What an error reply means: an outage to wait out, or a refusal of this command alone.
@Suite("Redis error replies", .timeLimit(.minutes(3)))
struct RedisErrorTests {
    /// Replies as Redis 6.2 words them for a write inside a script (the inner reply after the
    /// script's position), and as Redis 7 does, and top-level ones.
    static let outages = [
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:3: @user_script: 3: -READONLY You can't write against a read only replica. ",
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:5: @user_script: 5: -OOM command not allowed when used memory > 'maxmemory'. ",
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:1: @user_script: 1: -MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'. ",
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:2: @user_script: 2: -TRYAGAIN Multiple keys request during rehashing of slot ",
        "READONLY You can't write against a read only replica. script: 8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39, on @user_script:3.",
        "OOM command not allowed when used memory > 'maxmemory'. script: 8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39, on @user_script:5.",
        "LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "CLUSTERDOWN The cluster is down",
        "NOREPLICAS Not enough good replicas to write.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        "ERR max number of clients reached",
    ]

    static let refusals = [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:4: user_script:4: attempt to compare nil with number ",
        "ERR Error running script (call to f_8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39): @user_script:2: @user_script: 2: -WRONGTYPE Operation against a key holding the wrong kind of value ",
        "WRONGTYPE Operation against a key holding the wrong kind of value script: 8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39, on @user_script:2.",
        "ERR user_script:4: attempt to compare nil with number script: 8ea0dd3f7e1a0c5e3a4d2c1b0a9f8e7d6c5b4a39, on @user_script:4.",
        "ERR wrong number of arguments for 'hset' command",
    ]

    @Test func outagesAreNotRefusalsAlsoFromInsideAScript() {
        for message in Self.outages {
            #expect(!RedisError.server(message).isRefusal, "\(message)")
        }
        #expect(RedisError.code(of: Self.outages[0]) == "READONLY")
        #expect(RedisError.code(of: Self.outages[1]) == "OOM")
        #expect(RedisError.code(of: Self.outages[4]) == "READONLY")
    }

    @Test func refusalsAreWhatAskingAgainCannotChange() {
        for message in Self.refusals {
            #expect(RedisError.server(message).isRefusal, "\(message)")
        }
        #expect(RedisError.code(of: Self.refusals[2]) == "WRONGTYPE")
        #expect(RedisError.code(of: "no code here") == nil)
        #expect(!RedisError.server("no code here").isRefusal)
        #expect(!RedisError.timedOut.isRefusal)
    }

    static func code(_ error: RedisError) -> Substring? {
        guard case .server(let message) = error else { return nil }
        return RedisError.code(of: message)
    }

    static let write = RedisScript("return redis.call('SET', KEYS[1], ARGV[1])")

    /// A script's write that `server` refuses comes back with `code`, and is an outage.
    static func expectOutage(writingTo server: RedisServerProcess, code: Substring) async throws {
        let client = try RedisClientTests.client(server.url)
        do {
            _ = try await client.evaluate(Self.write, keys: ["k"], arguments: ["v"])
            Issue.record("the write was accepted")
        } catch {
            #expect(Self.code(error) == code, "\(error)")
            #expect(!error.isRefusal, "\(error)")
        }
        await client.shutdown()
    }

    @Test func aScriptWritingToAReplicaIsAnOutage() async throws {
        let master = try await RedisServerProcess.started()
        let replica = try await RedisServerProcess.started(arguments: ["--replicaof", "127.0.0.1", "\(master.port)"])
        try await Self.expectOutage(writingTo: replica, code: "READONLY")
        withExtendedLifetime(master) {}
    }

    @Test func aScriptWritingToAFullRedisIsAnOutage() async throws {
        let server = try await RedisServerProcess.started(arguments: ["--maxmemory", "1", "--maxmemory-policy", "noeviction"])
        try await Self.expectOutage(writingTo: server, code: "OOM")
    }
}

@Suite("TLS server names", .timeLimit(.minutes(1)))
struct TLSServerNameTests {
    /// SNI carries host names, never addresses: a name that starts with a digit is a name.
    @Test func addressesSendNoNameAndNamesStartingWithADigitDo() {
        for name in ["cache.internal", "1password.example", "9cache", "redis-0.redis.default.svc"] {
            #expect(TLSServerName.of(host: name) == name, "\(name)")
        }
        for address in ["10.0.0.1", "127.0.0.1", "::1", "fd00::2", "[fd00::2]"] {
            #expect(TLSServerName.of(host: address) == nil, "\(address)")
        }
    }
}
