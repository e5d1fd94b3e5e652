import Redis
import RedisTesting
import Relay
import Testing
import TestSupport

/// Which Redis a policy test runs against.
enum RedisKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    /// One redis-server.
    case standalone
    /// A Redis Cluster of three masters.
    case cluster

    var testDescription: String { rawValue }
}

/// A private Redis for one test: a redis-server or a three-master Redis Cluster, released with
/// the test.
final class TestRedis: Sendable {
    let kind: RedisKind
    let server: RedisServerProcess?
    let cluster: RedisClusterProcess?

    init(_ server: RedisServerProcess) {
        kind = .standalone
        self.server = server
        cluster = nil
    }

    private init(cluster: RedisClusterProcess) {
        kind = .cluster
        server = nil
        self.cluster = cluster
    }

    /// Started off the cooperative pool (a cluster waits for processes and polls its nodes).
    static func start(_ kind: RedisKind) async throws -> TestRedis {
        switch kind {
        case .standalone: TestRedis(try await onOwnThread { Result { try RedisServerProcess() } }.get())
        case .cluster: TestRedis(cluster: try await onOwnThread { Result { try RedisClusterProcess(masters: 3) } }.get())
        }
    }

    /// The URL of the server, or of the cluster's seed node.
    var url: String { server?.url ?? cluster!.url }

    /// Points a relay at it.
    func apply(to configuration: inout RelayConfiguration) {
        configuration.redis.url = url
        configuration.redis.mode = kind == .cluster ? .cluster : .standalone
    }

    /// A client of it, to look at what the relay wrote.
    func client() throws -> RedisClient {
        var configuration = RedisConfiguration(url: try RedisURL(parsing: url))
        configuration.mode = kind == .cluster ? .cluster : .standalone
        // A test's own calls: room for a loaded machine (a first call in cluster mode reads the
        // slot map and loads its script first).
        configuration.commandTimeout = .seconds(10)
        return try RedisClient(configuration: configuration)
    }
}
