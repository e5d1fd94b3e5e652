/// Writes one JSON object with its keys in the order given (outcomes and CLI answers are read by
/// people as well as machines). `null` is written only where asked for.
public struct JSONObjectWriter: Sendable {
    private var text = "{"
    private var empty = true

    public init() {}

    private mutating func key(_ name: String) {
        if !empty { text += "," }
        empty = false
        text += Self.quote(name)
        text += ":"
    }

    public mutating func add(_ name: String, _ value: String) {
        key(name)
        text += Self.quote(value)
    }

    public mutating func add<N: BinaryInteger>(_ name: String, _ value: N) {
        key(name)
        text += String(value)
    }

    /// Adds the value, or `null` when it is nil.
    public mutating func addOrNull(_ name: String, _ value: String?) {
        if let value { add(name, value) } else { addNull(name) }
    }

    public mutating func addOrNull<N: BinaryInteger>(_ name: String, _ value: N?) {
        if let value { add(name, value) } else { addNull(name) }
    }

    /// Adds the value, or nothing when it is nil.
    public mutating func addIfPresent(_ name: String, _ value: String?) {
        if let value { add(name, value) }
    }

    public mutating func addIfPresent<N: BinaryInteger>(_ name: String, _ value: N?) {
        if let value { add(name, value) }
    }

    public mutating func addNull(_ name: String) {
        key(name)
        text += "null"
    }

    public var json: String { text + "}" }

    public static func quote(_ string: String) -> String {
        var out = "\""
        out.reserveCapacity(string.utf8.count + 2)
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
