import Foundation
import Logging

/// Output helpers for the commands.
enum Terminal {
    /// One line on standard error.
    static func error(_ message: String) {
        FileHandle.standardError.write(Data("apns-relay: \(message)\n".utf8))
    }

    /// Logs go to stderr at error level only: for commands whose output is the point.
    static func logErrorsOnly() {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .error
            return handler
        }
    }

    /// One line on standard output, written at once (other programs wait for it).
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}

/// Peak resident set size of this process, in MiB (Linux: VmHWM).
func peakResidentMiB() -> Double? {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        let kilobytes = line.split(separator: " ").compactMap { Double($0) }.first
        return kilobytes.map { $0 / 1024 }
    }
    return nil
}
