import APNs
import Crypto
import Redis
import Relay
import Synchronization
import Testing
import RedisTesting

@Suite("Fleet-wide provider token in Redis", .timeLimit(.minutes(3)))
struct FleetTokenTests {
    final class Clock: Sendable {
        let now = Atomic<Int64>(1_700_000_000)
        func advance(minutes: Int64) { now.add(minutes * 60, ordering: .relaxed) }
        var read: @Sendable () -> Int64 { { self.now.load(ordering: .relaxed) } }
    }

    static func redisClient(_ server: RedisServerProcess) throws -> RedisClient {
        try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: server.url)))
    }

    /// `count` token sources for one key, each with its own Redis connections (relay processes),
    /// on a private redis-server and one test clock.
    /// The server is killed when released: callers keep it until they are done.
    static func fleet(_ count: Int) async throws -> (RedisServerProcess, Clock, [RedisProviderTokenSource]) {
        let server = try await RedisServerProcess.started()
        let (clock, sources) = try fleet(count) { try Self.redisClient(server) }
        return (server, clock, sources)
    }

    /// `count` token sources for one key, each with the Redis client `client` makes.
    static func fleet(_ count: Int, client: () throws -> RedisClient) throws -> (Clock, [RedisProviderTokenSource]) {
        let clock = Clock()
        let signer = ProviderTokenSigner(teamID: "TEAM123456", keyID: "ABC123DEFG", key: P256.Signing.PrivateKey())
        let sources = try (0..<count).map { _ in try RedisProviderTokenSource(signer: signer, redis: try client(), keyPrefix: "apns-relay:", clock: clock.read) }
        return (clock, sources)
    }

    @Test(arguments: RedisKind.allCases)
    func processesShareOneTokenAndOneMintPerRefresh(_ kind: RedisKind) async throws {
        // Two relay processes: their own Redis connections, the same key.
        let redis = try await TestRedis.start(kind)
        let (clock, sources) = try Self.fleet(2) { try redis.client() }
        let (first, second) = (sources[0], sources[1])

        let a = try await first.currentToken()
        let b = try await second.currentToken()
        #expect(a == b)
        #expect(first.mintCount + second.mintCount == 1)

        // 49 minutes on both keep it; at 50 the first to ask mints, the other takes that one.
        clock.advance(minutes: 49)
        #expect(try await second.currentToken() == a)
        clock.advance(minutes: 1)
        let c = try await second.currentToken()
        #expect(c != a && c.issuedAt == clock.now.load(ordering: .relaxed))
        #expect(try await first.currentToken() == c)
        #expect(first.mintCount + second.mintCount == 2)
        withExtendedLifetime(redis) {}
    }

    @Test func manyCallersAtOnceMintOnce() async throws {
        let (server, _, sources) = try await Self.fleet(4)
        let tokens = try await withThrowingTaskGroup(of: ProviderToken.self) { group in
            for index in 0..<200 {
                group.addTask { try await sources[index % sources.count].currentToken() }
            }
            return try await group.reduce(into: Set<String>()) { $0.insert($1.jwt) }
        }
        #expect(tokens.count == 1)
        #expect(sources.reduce(0) { $0 + $1.mintCount } == 1)
        withExtendedLifetime(server) {}
    }

    @Test func expiredProviderTokenReplacesItOnlyAfterTwentyMinutes() async throws {
        let (server, clock, sources) = try await Self.fleet(2)
        let (first, second) = (sources[0], sources[1])
        let token = try await first.currentToken()
        clock.advance(minutes: 10)
        #expect(try await first.refresh(after: token) == token)
        clock.advance(minutes: 10)
        let fresh = try await first.refresh(after: token)
        #expect(fresh != token)
        // The other process reports the same stale token: it gets the new one, no second mint.
        #expect(try await second.refresh(after: token) == fresh)
        #expect(first.mintCount + second.mintCount == 2)
        withExtendedLifetime(server) {}
    }

    @Test func aTokenFromAClockAheadIsReplacedNotTrustedUntilItAges() async throws {
        // One host's clock runs two hours ahead: the token it stores would never be due by age
        // on the others' clocks, and APNs rejects a token issued in the future.
        let server = try await RedisServerProcess.started()
        let signer = ProviderTokenSigner(teamID: "TEAM123456", keyID: "ABC123DEFG", key: P256.Signing.PrivateKey())
        let (ahead, right) = (Clock(), Clock())
        ahead.advance(minutes: 120)
        let skewed = try RedisProviderTokenSource(signer: signer, redis: try Self.redisClient(server), keyPrefix: "apns-relay:", clock: ahead.read)
        let correct = try RedisProviderTokenSource(signer: signer, redis: try Self.redisClient(server), keyPrefix: "apns-relay:", clock: right.read)
        let future = try await skewed.currentToken()
        let token = try await correct.currentToken()
        #expect(token != future && token.issuedAt == right.now.load(ordering: .relaxed))
        // A host whose clock is behind by less than the allowed skew keeps it.
        let behind = token.issuedAt - LocalProviderTokenSource.allowedFutureSkew + 1
        let slow = try RedisProviderTokenSource(signer: signer, redis: try Self.redisClient(server), keyPrefix: "apns-relay:", clock: { behind })
        #expect(try await slow.currentToken() == token)
        withExtendedLifetime(server) {}
    }

    @Test func aLocalTokenFromTheFutureIsReplaced() throws {
        // The process' own clock stepped back by an hour after it minted.
        let clock = Clock()
        let signer = ProviderTokenSigner(teamID: "TEAM123456", keyID: "ABC123DEFG", key: P256.Signing.PrivateKey())
        let source = try LocalProviderTokenSource(signer: signer, clock: clock.read, countsRequests: false)
        let first = try source.currentToken()
        clock.advance(minutes: -60)
        let second = try source.currentToken()
        #expect(second != first && second.issuedAt == clock.now.load(ordering: .relaxed))
        #expect(try source.refresh(after: second) == second)
    }

    @Test func withoutRedisAProcessMintsForItself() async throws {
        let port = try RedisServerProcess.freePort()
        let clock = Clock()
        let signer = ProviderTokenSigner(teamID: "TEAM123456", keyID: "ABC123DEFG", key: P256.Signing.PrivateKey())
        let redis = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: "redis://127.0.0.1:\(port)")))
        let source = try RedisProviderTokenSource(signer: signer, redis: redis, keyPrefix: "apns-relay:", clock: clock.read)
        let token = try await source.currentToken()
        #expect(token.issuedAt == clock.now.load(ordering: .relaxed))
        #expect(try await source.currentToken() == token)
        #expect(source.mintCount == 1)
        await redis.shutdown()
    }
}
