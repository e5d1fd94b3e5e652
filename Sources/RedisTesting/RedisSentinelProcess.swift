import Common
import Foundation
import Spawn

/// A private Redis Sentinel (`redis-server <file> --sentinel`) on a free loopback port,
/// monitoring one master as `mymaster` with quorum 1: for the tests. Failure detection is fast
/// (the master is down after 1 s without an answer). With `password`, clients must `AUTH` to
/// it (`requirepass`); with `masterPassword`, it authenticates to the master and its replicas
/// (`sentinel auth-pass`). Killed when released.
public final class RedisSentinelProcess: Sendable {
    public let port: Int
    public let masterName: String
    private let process: Locked<ChildProcess?>
    private let configFile: String
    /// Its own directory (the configuration it rewrites), removed when it is released.
    private let directory: URL

    /// `redis://127.0.0.1:<port>/0`: what `redis.url` names in sentinel mode.
    public var url: String { "redis://127.0.0.1:\(port)/0" }

    public init(masterPort: Int, masterName: String = "mymaster", password: String? = nil, masterPassword: String? = nil) throws {
        self.masterName = masterName
        let port = try RedisServerProcess.freePort()
        self.port = port
        // Sentinel rewrites its configuration file: one of its own in the temporary directory.
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("sentinel-\(port)-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        configFile = directory.appendingPathComponent("sentinel.conf").path
        try """
            port \(port)
            bind 127.0.0.1
            dir \(directory.path)
            sentinel monitor \(masterName) 127.0.0.1 \(masterPort) 1
            sentinel down-after-milliseconds \(masterName) 1000
            sentinel failover-timeout \(masterName) 3000
            sentinel parallel-syncs \(masterName) 1
            \(password.map { "requirepass \($0)" } ?? "")
            \(masterPassword.map { "sentinel auth-pass \(masterName) \($0)" } ?? "")

            """.write(toFile: configFile, atomically: true, encoding: .utf8)
        // Its log says when it watches the master.
        let started = try RedisServerProcess.started([configFile, "--sentinel", "--logfile", ""], readyWhenItLogs: "+monitor master")
        process = Locked(started)
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// Kills it.
    public func stop() {
        guard let process = process.withLock({ $0 }), process.isRunning else { return }
        process.signal(SIGKILL)
        process.wait()
    }
}
