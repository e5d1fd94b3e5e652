import Foundation
import Synchronization
import Spawn

/// A private Redis Sentinel (`redis-server <file> --sentinel`) on a free loopback port,
/// monitoring one master as `mymaster` with quorum 1: for the tests. Failure detection is fast
/// (the master is down after 1 s without an answer). Killed when released.
public final class RedisSentinelProcess: Sendable {
    public let port: Int
    public let masterName: String
    private let process: Mutex<ChildProcess?>
    private let configFile: String

    /// `redis://127.0.0.1:<port>/0`: what `redis.url` names in sentinel mode.
    public var url: String { "redis://127.0.0.1:\(port)/0" }

    public init(masterPort: Int, masterName: String = "mymaster") throws {
        self.masterName = masterName
        let port = try RedisServerProcess.freePort()
        self.port = port
        // Sentinel rewrites its configuration file: one of its own in the temporary directory.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sentinel-\(port)-\(UUID().uuidString.prefix(8))")
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

            """.write(toFile: configFile, atomically: true, encoding: .utf8)
        let (started, output) = try ChildProcess.capturingOutput(executable: try RedisServerProcess.executable(),
                                                                 arguments: [configFile, "--sentinel", "--logfile", ""])
        // Its log says when it watches the master.
        var log: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 {
                close(output)
                started.wait()
                throw RedisServerProcess.ServerFailed(log: String(decoding: log, as: UTF8.self))
            }
            log.append(contentsOf: chunk[..<count])
            if String(decoding: log, as: UTF8.self).contains("+monitor master") { break }
        }
        Thread.detachNewThread { _ = ChildProcess.readToEnd(output) }
        process = Mutex(started)
    }

    deinit { stop() }

    /// Kills it.
    public func stop() {
        guard let process = process.withLock({ $0 }), process.isRunning else { return }
        process.signal(SIGKILL)
        process.wait()
    }
}
