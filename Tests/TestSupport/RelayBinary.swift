public import Foundation

/// The `apns-relay` binary, built next to the test bundle.
public enum RelayBinary {
    public static var url: URL {
        let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = testBinary.deletingLastPathComponent()
        // Swift Testing may run from inside the .xctest bundle on Linux.
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("apns-relay").path),
              directory.pathComponents.count > 1 {
            directory.deleteLastPathComponent()
        }
        return directory.appendingPathComponent("apns-relay")
    }

    public struct Output: Sendable {
        public var status: Int32
        public var stdout: String
        public var stderr: String
    }

    /// Runs the binary to completion on a thread of its own (never on the test's cooperative
    /// pool, which has one thread per core: a blocked one stalls every other test).
    public static func run(_ arguments: [String]) async throws -> Output {
        try await onOwnThread { Result { try runToEnd(arguments) } }.get()
    }

    /// Runs the binary to completion, blocking. Both pipes are drained at once, so a chatty
    /// stderr cannot block the child.
    private static func runToEnd(_ arguments: [String]) throws -> Output {
        let process = Process()
        process.executableURL = url
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let stderr = Collected()
        let stderrDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            stderr.data = err.fileHandleForReading.readDataToEndOfFile()
            stderrDone.signal()
        }
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        stderrDone.wait()
        let stderrData = stderr.data
        process.waitUntilExit()
        return Output(status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
                      stderr: String(decoding: stderrData, as: UTF8.self))
    }
}

/// Bytes one thread writes before signalling and another reads after waiting.
private final class Collected: @unchecked Sendable {
    var data = Data()
}

/// Runs a blocking call (waiting for a process, say) on a thread of its own, so that it never
/// holds one of the cooperative pool's few threads.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}
