import Common
import Foundation
import Logging

/// Output helpers for the commands.
public enum Terminal {
    /// How the process logs (``LoggingOptions/bootstrap(defaultLevel:)`` sets it).
    static let logFormat = Locked(LogFormat.text)

    /// One line on standard error.
    public static func error(_ message: String) {
        FileHandle.standardError.write(Data("apns-relay: \(message)\n".utf8))
    }

    /// Why the process stops (or what keeps it from starting): a log line at `critical` when
    /// logs are JSON (so that a log pipeline parsing every line gets it too), else ``error(_:)``.
    public static func fatal(_ message: String) {
        guard logFormat.withLock({ $0 }) == .json else { return error(message) }
        Logger(label: "apns-relay").critical("\(message)")
    }

    /// One line on standard output, written at once (other programs wait for it).
    public static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}
