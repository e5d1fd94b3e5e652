import Foundation
import NIOPosix

/// A private `redis-server` on a free loopback port, without persistence: for the demo, the
/// benchmarks and the tests. Killed when released.
public final class RedisServerProcess: @unchecked Sendable {
    /// Fixed once started: restarts come back on it.
    public private(set) var port: Int
    private var process: Process?
    private let extraArguments: [String]
    /// With TLS: the certificate and key files (PEM); then only the TLS port listens.
    private let tls: (certificate: String, key: String)?

    public var url: String { "\(tls == nil ? "redis" : "rediss")://127.0.0.1:\(port)/0" }

    /// - Parameter tls: PEM certificate and key files: serve TLS only (clients need no certificate).
    public init(arguments: [String] = [], tls: (certificate: String, key: String)? = nil) throws {
        port = 0
        extraArguments = arguments
        self.tls = tls
        // A free port can be taken by someone else before redis-server binds it: try another.
        for attempt in 1...5 {
            port = try Self.freePort()
            do {
                try start()
                return
            } catch let failure as ServerFailed where failure.log.contains("Address already in use") && attempt < 5 {
                continue
            }
        }
    }

    deinit { stop() }

    /// Starts (again) on the same port and returns once it accepts connections.
    public func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try Self.executable())
        let listen = tls.map { ["--port", "0", "--tls-port", "\(port)", "--tls-cert-file", $0.certificate,
                                "--tls-key-file", $0.key, "--tls-auth-clients", "no"] } ?? ["--port", "\(port)"]
        process.arguments = listen + ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--daemonize", "no", "--logfile", ""] + extraArguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        self.process = process
        // Its log says when it is ready.
        var log = Data()
        while true {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { throw ServerFailed(log: String(decoding: log, as: UTF8.self)) }
            log.append(chunk)
            if String(decoding: log, as: UTF8.self).contains("Ready to accept connections") { break }
        }
        // Keep draining its log so it never blocks on a full pipe.
        output.fileHandleForReading.readabilityHandler = { handle in _ = handle.availableData }
    }

    /// Kills it (SIGKILL: a parent's threads may block SIGTERM, and children inherit that mask;
    /// with no persistence nothing is lost).
    public func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    struct ServerFailed: Error, CustomStringConvertible {
        var log: String
        var description: String { "redis-server did not start:\n\(log)" }
    }

    private static func executable() throws -> String {
        for path in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        throw ServerFailed(log: "redis-server is not installed (apt-get install redis-server; the scripts install it)")
    }

    public static func freePort() throws -> Int {
        let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).wait()
        let port = channel.localAddress!.port!
        try channel.close().wait()
        return port
    }
}
