/// Writes one JSON object with its keys in the order given (outcomes, CLI answers and JSON log
/// lines are read by people as well as machines). `null` is written only where asked for. Builds UTF-8 bytes
/// directly: one outcome per intent goes through it.
public struct JSONObjectWriter: Sendable {
    @usableFromInline var bytes: [UInt8]
    @usableFromInline var empty = true

    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
        bytes.append(UInt8(ascii: "{"))
    }

    @usableFromInline
    mutating func key(_ name: StaticString) {
        if !empty { bytes.append(UInt8(ascii: ",")) }
        empty = false
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
    }

    /// A key known only at run time (log metadata, say), escaped as JSON needs.
    @usableFromInline
    mutating func key(_ name: String) {
        if !empty { bytes.append(UInt8(ascii: ",")) }
        empty = false
        Self.appendQuoted(name, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
    }

    public mutating func add(key name: String, _ value: String) {
        key(name)
        Self.appendQuoted(value, to: &bytes)
    }

    /// Adds a value that is already JSON under a key known only at run time.
    @inlinable
    public mutating func addJSON(key name: String, _ json: some Sequence<UInt8>) {
        key(name)
        bytes.append(contentsOf: json)
    }

    public mutating func add(_ name: StaticString, _ value: String) {
        key(name)
        Self.appendQuoted(value, to: &bytes)
    }

    /// Inlinable, as its siblings for integers below: the caller's integer type is known where
    /// it calls, and a generic call from another module would go through `BinaryInteger`'s
    /// witnesses (2% of the relay's CPU, encoding outcomes; docs/performance.md).
    @inlinable
    public mutating func add<N: BinaryInteger>(_ name: StaticString, _ value: N) {
        addInteger(name, Int64(clamping: value))
    }

    @usableFromInline
    mutating func addInteger(_ name: StaticString, _ value: Int64) {
        key(name)
        DecimalDigits.append(value, to: &bytes)
    }

    /// Adds the value, or `null` when it is nil.
    public mutating func addOrNull(_ name: StaticString, _ value: String?) {
        if let value { add(name, value) } else { addNull(name) }
    }

    @inlinable
    public mutating func addOrNull<N: BinaryInteger>(_ name: StaticString, _ value: N?) {
        if let value { addInteger(name, Int64(clamping: value)) } else { addNull(name) }
    }

    /// Adds the value, or nothing when it is nil.
    public mutating func addIfPresent(_ name: StaticString, _ value: String?) {
        if let value { add(name, value) }
    }

    @inlinable
    public mutating func addIfPresent<N: BinaryInteger>(_ name: StaticString, _ value: N?) {
        if let value { addInteger(name, Int64(clamping: value)) }
    }

    /// Adds a value that is already JSON (an object, say), as it is (inlinable: the bytes are
    /// copied with the caller's sequence type known, not one by one through its witnesses).
    @inlinable
    public mutating func addJSON(_ name: StaticString, _ json: some Sequence<UInt8>) {
        key(name)
        bytes.append(contentsOf: json)
    }

    public mutating func addNull(_ name: StaticString) {
        key(name)
        let null: StaticString = "null"
        bytes.append(contentsOf: UnsafeBufferPointer(start: null.utf8Start, count: null.utf8CodeUnitCount))
    }

    /// The finished object as UTF-8 bytes (closes the object in place: no copy).
    public consuming func finish() -> [UInt8] {
        bytes.append(UInt8(ascii: "}"))
        return bytes
    }

    public var json: String {
        let copy = self
        return String(decoding: copy.finish(), as: UTF8.self)
    }

    /// `string` as a JSON string literal.
    public static func quote(_ string: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(string.utf8.count + 2)
        appendQuoted(string, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The string quoted, escaped as JSON needs: the runs between escapes are copied whole (a
    /// byte-by-byte append was about 1.5% of the relay's CPU).
    private static func appendQuoted(_ string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var string = string
        string.withUTF8 { bytes in
            var start = 0
            for index in 0..<bytes.count {
                let byte = bytes[index]
                guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<index]))
                appendEscaped(byte, to: &out)
                start = index + 1
            }
            // UTF-8 above 0x7F passes through: JSON text is UTF-8.
            out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start...]))
        }
        out.append(UInt8(ascii: "\""))
    }

    private static func appendEscaped(_ byte: UInt8, to out: inout [UInt8]) {
        switch byte {
        case UInt8(ascii: "\""): out.append(contentsOf: #"\""#.utf8)
        case UInt8(ascii: "\\"): out.append(contentsOf: #"\\"#.utf8)
        case 0x0A: out.append(contentsOf: #"\n"#.utf8)
        case 0x0D: out.append(contentsOf: #"\r"#.utf8)
        case 0x09: out.append(contentsOf: #"\t"#.utf8)
        default:
            let low = byte & 0xF
            out.append(contentsOf: #"\u00"#.utf8)
            out.append(UInt8(ascii: "0") + (byte >> 4))
            out.append(low < 10 ? UInt8(ascii: "0") + low : UInt8(ascii: "a") + low - 10)
        }
    }
}
