import Foundation

/// Output helpers for the commands.
public enum Terminal {
    /// One line on standard error.
    public static func error(_ message: String) {
        FileHandle.standardError.write(Data("apns-relay: \(message)\n".utf8))
    }

    /// One line on standard output, written at once (other programs wait for it).
    public static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}
