import Foundation
import Spawn
import Common

/// A private `tinyproxy` (Debian's package) on a free loopback port: a real HTTP proxy that
/// answers `CONNECT`, for the egress-proxy tests. Killed when released.
public final class TinyproxyProcess: Sendable {
    public let port: Int
    private let process: ChildProcess
    /// What it logged so far (its connections, each `CONNECT`).
    private let logged = Logged()

    private final class Logged: Sendable {
        let bytes = Locked<[UInt8]>([])
    }

    /// - Parameters:
    ///   - basicAuth: user and password it requires (`BasicAuth`), else none.
    ///   - connectPorts: the only ports it tunnels to; empty: any.
    public init(basicAuth: (user: String, password: String)? = nil, connectPorts: [Int] = []) throws {
        var attempt = 1
        while true {
            let candidate = try LoopbackPort.free()
            var lines = ["Port \(candidate)", "Listen 127.0.0.1", "Timeout 60", "MaxClients 100", "Allow 127.0.0.1", "LogLevel Info"]
            lines += connectPorts.map { "ConnectPort \($0)" }
            if let basicAuth { lines.append("BasicAuth \(basicAuth.user) \(basicAuth.password)") }
            let file = TestFiles.path("tinyproxy-\(UUID().uuidString).conf").path
            try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
            let (process, output) = try ChildProcess.capturingOutput(executable: try Self.executable(), arguments: ["-d", "-c", file])
            if let log = Self.waitUntilListening(output) {
                port = candidate
                self.process = process
                logged.bytes.withLock { $0 = log }
                Thread.detachNewThread { [logged] in
                    var chunk = [UInt8](repeating: 0, count: 4096)
                    while true {
                        let count = chunk.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
                        if count < 0 && errno == EINTR { continue }
                        if count <= 0 { break }
                        logged.bytes.withLock { $0 += chunk[..<count] }
                    }
                    close(output)
                }
                return
            }
            process.signal(SIGKILL)
            process.wait()
            // readToEnd closes the pipe.
            let log = String(decoding: ChildProcess.readToEnd(output), as: UTF8.self)
            guard attempt < 5 else { throw Failed(description: "tinyproxy did not start:\n\(log)") }
            attempt += 1
        }
    }

    /// ``init(basicAuth:connectPorts:)`` on a thread of its own (it waits for the proxy to listen).
    public static func started(basicAuth: (user: String, password: String)? = nil, connectPorts: [Int] = []) async throws -> TinyproxyProcess {
        try await onOwnThread { Result { try TinyproxyProcess(basicAuth: basicAuth, connectPorts: connectPorts) } }.get()
    }

    deinit {
        if process.isRunning {
            process.signal(SIGKILL)
            process.wait()
        }
    }

    public var url: String { "http://127.0.0.1:\(port)" }

    /// Its log so far.
    public var log: String { logged.bytes.withLock { String(decoding: $0, as: UTF8.self) } }

    /// Reads its log until it accepts connections (the log so far), or nil when it exits first.
    private static func waitUntilListening(_ output: Int32) -> [UInt8]? {
        var log: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { return nil }
            log.append(contentsOf: chunk[..<count])
            let text = String(decoding: log, as: UTF8.self)
            if text.contains("Accepting connections") { return log }
            if text.contains("Could not create listening sockets") { return nil }
        }
    }

    struct Failed: Error, CustomStringConvertible {
        var description: String
    }

    private static func executable() throws -> String {
        for path in ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        throw Failed(description: "tinyproxy is not installed (apt-get install tinyproxy; scripts/test installs it)")
    }
}
