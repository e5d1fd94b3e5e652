import Common
import Foundation
import Synchronization
import Spawn

/// A private `redis-server` on a free loopback port, without persistence: for the demo, the
/// benchmarks and the tests. Killed when released.
///
/// Each server has a directory of its own (its `--dir`, kept across its restarts, removed when
/// it is released). A replica's full sync writes the master's snapshot there as `dump.rdb`, and
/// every redis-server loads a `dump.rdb` it finds in its directory when it starts: with one
/// directory for all, a server started after another's sync began with that one's data.
public final class RedisServerProcess: Sendable {
    /// Fixed once started: restarts come back on it.
    public let port: Int
    /// The running server (nil before the first start); replaced by ``start()``.
    private let process = Locked<ChildProcess?>(nil)
    private let extraArguments: [String]
    /// Its `--dir` (nil: the arguments name one).
    private let directory: String?
    /// With TLS: the certificate and key files (PEM); then only the TLS port listens.
    private let tls: (certificate: String, key: String)?

    public var url: String { "\(tls == nil ? "redis" : "rediss")://127.0.0.1:\(port)/0" }

    /// - Parameter tls: PEM certificate and key files: serve TLS only (clients need no certificate).
    public init(arguments: [String] = [], tls: (certificate: String, key: String)? = nil) throws {
        extraArguments = arguments
        self.tls = tls
        // Its own directory, unless the arguments name one (a cluster's nodes share theirs).
        let directory = arguments.contains("--dir") ? nil
            : FileManager.default.temporaryDirectory.appendingPathComponent("redis-\(UUID().uuidString.prefix(12))").path
        if let directory { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        self.directory = directory
        // A free port can be taken by someone else before redis-server binds it: try another.
        var attempt = 1
        while true {
            do {
                let candidate = try Self.freePort()
                do {
                    let started = try Self.launch(port: candidate, tls: tls, directory: directory, extraArguments: arguments)
                    port = candidate
                    process.withLock { $0 = started }
                    return
                } catch let failure as ServerFailed where failure.log.contains("Address already in use") && attempt < 5 {
                    attempt += 1
                }
            } catch {
                if let directory { try? FileManager.default.removeItem(atPath: directory) }
                throw error
            }
        }
    }

    deinit {
        stop()
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// ``init(arguments:tls:)`` on a thread of its own: waiting for the server to be ready
    /// never holds a thread of the concurrency pool (async callers use this).
    public static func started(arguments: [String] = [], tls: (certificate: String, key: String)? = nil) async throws -> RedisServerProcess {
        try await offThread { try RedisServerProcess(arguments: arguments, tls: tls) }
    }

    /// ``start()`` on a thread of its own.
    public func restart() async throws {
        try await Self.offThread { try self.start() }
    }

    /// Runs `body` on a new thread and returns what it returned (or throws what it threw).
    static func offThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
        }
    }

    /// Starts (again) on the same port and returns once it accepts connections.
    public func start() throws {
        let started = try Self.launch(port: port, tls: tls, directory: directory, extraArguments: extraArguments)
        process.withLock { $0 = started }
    }

    static func launch(port: Int, tls: (certificate: String, key: String)?, directory: String?,
                       extraArguments: [String]) throws -> ChildProcess {
        let listen = tls.map { ["--port", "0", "--tls-port", "\(port)", "--tls-cert-file", $0.certificate,
                                "--tls-key-file", $0.key, "--tls-auth-clients", "no"] } ?? ["--port", "\(port)"]
        // Its files (a replica's full sync writes an RDB) go to its own directory; a --dir
        // among the extra arguments wins.
        let arguments = listen + ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                  "--daemonize", "no", "--logfile", ""] + (directory.map { ["--dir", $0] } ?? [])
            + extraArguments
        return try started(arguments, readyWhenItLogs: "Ready to accept connections")
    }

    /// Starts redis-server with `arguments` and returns once its log says `ready` (it throws
    /// with the log when the server ends first); its log is drained from then on, so that it
    /// never blocks on a full pipe.
    static func started(_ arguments: [String], readyWhenItLogs ready: String) throws -> ChildProcess {
        let (process, output) = try ChildProcess.capturingOutput(executable: try Self.executable(), arguments: arguments)
        var log: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 {
                close(output)
                process.wait()
                throw ServerFailed(log: String(decoding: log, as: UTF8.self))
            }
            log.append(contentsOf: chunk[..<count])
            if String(decoding: log, as: UTF8.self).contains(ready) { break }
        }
        Thread.detachNewThread { _ = ChildProcess.readToEnd(output) }
        return process
    }

    public var isRunning: Bool { process.withLock { $0 }?.isRunning ?? false }

    /// Sends `signal` to the server (SIGSTOP and SIGCONT pause and resume it: its connections
    /// stay open and unanswered, as a Redis stalled by a long command or a fork would be).
    public func signal(_ signal: Int32) {
        guard let process = process.withLock({ $0 }), process.isRunning else { return }
        process.signal(signal)
    }

    /// Kills it (SIGKILL: without persistence there is nothing to save, and nothing to wait for).
    public func stop() {
        guard let process = process.withLock({ $0 }), process.isRunning else { return }
        process.signal(SIGKILL)
        process.wait()
    }

    struct ServerFailed: Error, CustomStringConvertible {
        var log: String
        var description: String { "redis-server did not start:\n\(log)" }
    }

    static func executable() throws -> String {
        for path in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        throw ServerFailed(log: "redis-server is not installed (apt-get install redis-server; the scripts install it)")
    }

    public static func freePort() throws -> Int {
        try LoopbackPort.free()
    }
}
