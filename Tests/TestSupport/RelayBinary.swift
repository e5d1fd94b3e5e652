public import Foundation
import Spawn

/// The `apns-relay` binary (or, with `dev`, `apns-relay-dev`), built next to the test bundle.
public enum RelayBinary {
    public static var url: URL { built("apns-relay") }
    /// The development tools: demo, simulate, bench.
    public static var devURL: URL { built("apns-relay-dev") }

    private static func built(_ name: String) -> URL {
        let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = testBinary.deletingLastPathComponent()
        // Swift Testing may run from inside the .xctest bundle on Linux.
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent(name).path),
              directory.pathComponents.count > 1 {
            directory.deleteLastPathComponent()
        }
        return directory.appendingPathComponent(name)
    }

    public struct Output: Sendable {
        public var status: Int32
        public var stdout: String
        public var stderr: String
    }

    /// Runs the binary to completion on a thread of its own (never on the test's cooperative
    /// pool, which has one thread per core: a blocked one stalls every other test).
    public static func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> Output {
        try await onOwnThread { Result { try runProgram(url.path, arguments, environment: environment) } }.get()
    }

    /// ``run(_:)`` for `apns-relay-dev`.
    public static func runDev(_ arguments: [String], environment: [String: String] = [:]) async throws -> Output {
        try await onOwnThread { Result { try runProgram(devURL.path, arguments, environment: environment) } }.get()
    }
}

/// Runs a program to completion, blocking: its exit code (128 + the signal if one ended it) and
/// what it printed. Both pipes are drained at once, so a chatty stderr cannot block the child.
public func runProgram(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> RelayBinary.Output {
    let out = try ChildProcess.makePipe(), err = try ChildProcess.makePipe()
    let process: ChildProcess
    do {
        process = try ChildProcess(executable: executable, arguments: arguments,
                                   standardOutput: out.write, standardError: err.write, environment: environment)
    } catch {
        for descriptor in [out.read, out.write, err.read, err.write] { close(descriptor) }
        throw error
    }
    close(out.write)
    close(err.write)
    let stderr = Collected()
    let stderrDone = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
        stderr.bytes = ChildProcess.readToEnd(err.read)
        stderrDone.signal()
    }
    let stdout = ChildProcess.readToEnd(out.read)
    stderrDone.wait()
    let stderrBytes = stderr.bytes
    let status = process.wait()
    return RelayBinary.Output(status: status, stdout: String(decoding: stdout, as: UTF8.self),
                              stderr: String(decoding: stderrBytes, as: UTF8.self))
}

/// Bytes one thread writes before signalling and another reads after waiting.
/// `@unchecked Sendable`: that signal orders the write before the read.
private final class Collected: @unchecked Sendable {
    var bytes: [UInt8] = []
}

/// Runs a blocking call (waiting for a process, say) on a thread of its own, so that it never
/// holds one of the cooperative pool's few threads.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}
