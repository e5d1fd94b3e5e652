import Foundation

/// Output helpers for the commands.
enum Terminal {
    /// One line on standard error.
    static func error(_ message: String) {
        FileHandle.standardError.write(Data("apns-relay: \(message)\n".utf8))
    }

    /// One line on standard output, flushed at once (other programs wait for it).
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}

/// A JSON object written with its keys in the order given; nil values are left out.
struct OrderedJSON {
    private var parts: [String] = []

    mutating func add(_ key: String, _ value: String?) {
        guard let value else { return }
        parts.append("\(Self.quote(key)):\(Self.quote(value))")
    }

    mutating func add<N: BinaryInteger>(_ key: String, _ value: N?) {
        guard let value else { return }
        parts.append("\(Self.quote(key)):\(value)")
    }

    var text: String { "{" + parts.joined(separator: ",") + "}" }

    static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
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
