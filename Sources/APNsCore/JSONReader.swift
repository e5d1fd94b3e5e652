public import NIOCore
/// A single-pass JSON reader over bytes, for the hot paths (every intent, every payload) where
/// building a Foundation object tree costs more than the rest of the work.
///
/// It follows the RFC 8259 grammar exactly (strings with every escape, numbers, literals,
/// nesting at most ``maximumDepth`` deep) and never allocates except for the strings it is asked
/// to decode. Callers walk objects with ``forEachMember(_:)`` and either read a member's value
/// (``readValue()``) or skip it (``skipValue(depth:)``).
public struct JSONReader {
    public static let maximumDepth = 64

    public enum Failure: Error, Equatable, Sendable {
        case malformed(offset: Int)
        /// A string holds bytes that are not UTF-8 (RFC 3629: no overlong forms, no surrogates,
        /// nothing past U+10FFFF), or a `\u` escape of a surrogate without its pair (no UTF-8
        /// can hold it; RFC 8259 §8.2 calls such strings unpredictable), first at this offset.
        case invalidUTF8(offset: Int)
        /// A number no double can hold (its magnitude rounds to infinity, as `1e999` does), at
        /// this offset: RFC 8259 §6 lets parsers refuse it, and Foundation's does.
        case numberOutOfRange(offset: Int)
        case tooDeep
    }

    /// One value as read: scalars decoded, containers as the byte range they span.
    public enum Value: Equatable, Sendable {
        case string(String)
        /// A number whose text is an integer (no fraction or exponent) that fits 64 bits.
        case integer(Int64)
        /// Any other number (fraction, exponent, or too large for 64 bits).
        case number(Double)
        case bool(Bool)
        case null
        case object(Range<Int>)
        case array(Range<Int>)

        /// The integer this value is exactly, for numbers written as `10` or `10.0`.
        public var exactInteger: Int64? {
            switch self {
            case .integer(let value): value
            case .number(let value): Int64(exactly: value)
            default: nil
            }
        }
    }

    public let bytes: UnsafeRawBufferPointer
    /// Where reading continues.
    public var index = 0

    public init(_ bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    /// Checks that the bytes are exactly one JSON value (whitespace around it allowed).
    public static func validate(_ bytes: UnsafeRawBufferPointer) throws(Failure) {
        var reader = JSONReader(bytes)
        try reader.skipValue(depth: 0)
        try reader.expectEnd()
    }

    /// Well-formed JSON without its insignificant whitespace (whitespace inside strings stays),
    /// written straight into the buffer a request's body is sent from (no copy in between).
    /// Only for bytes that already passed the reader.
    public static func compacted(_ bytes: UnsafeRawBufferPointer) -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: bytes.count)
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: bytes.count) { out in
            var written = 0
            var inString = false
            var escaped = false
            for byte in bytes {
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = true
                    } else if byte == UInt8(ascii: "\"") {
                        inString = false
                    }
                } else if byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D {
                    continue
                } else if byte == UInt8(ascii: "\"") {
                    inString = true
                }
                out[written] = byte
                written += 1
            }
            return written
        }
        return buffer
    }

    // MARK: Structure

    /// True when the next value starts with `byte` (after whitespace).
    public mutating func nextIs(_ byte: UInt8) -> Bool {
        skipWhitespace()
        return peek() == byte
    }

    /// Walks the members of the object that starts here, calling `visit` with each key while
    /// the reader stands at that member's value; `visit` must consume the value.
    public mutating func forEachMember(
        _ visit: (inout JSONReader, String) throws(Failure) -> Void
    ) throws(Failure) {
        try expect(UInt8(ascii: "{"))
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            index += 1
            return
        }
        while true {
            skipWhitespace()
            let key = try string()
            try expect(UInt8(ascii: ":"))
            skipWhitespace()
            try visit(&self, key)
            if try endOfContainer(UInt8(ascii: "}")) { return }
        }
    }

    /// Reads the next value: scalars decoded, objects and arrays skipped and returned as ranges.
    public mutating func readValue(depth: Int = 0) throws(Failure) -> Value {
        skipWhitespace()
        let start = index
        switch peek() {
        case UInt8(ascii: "{")?:
            try skipValue(depth: depth)
            return .object(start..<index)
        case UInt8(ascii: "[")?:
            try skipValue(depth: depth)
            return .array(start..<index)
        case UInt8(ascii: "\"")?:
            return .string(try string())
        case UInt8(ascii: "t")?:
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f")?:
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n")?:
            try literal("null")
            return .null
        default:
            return try number()
        }
    }

    /// Skips one value of any kind.
    public mutating func skipValue(depth: Int) throws(Failure) {
        guard depth < Self.maximumDepth else { throw .tooDeep }
        skipWhitespace()
        guard let byte = peek() else { throw .malformed(offset: index) }
        switch byte {
        case UInt8(ascii: "{"):
            try forEachMember { reader, _ throws(Failure) in try reader.skipValue(depth: depth + 1) }
        case UInt8(ascii: "["):
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") {
                index += 1
                return
            }
            while true {
                try skipValue(depth: depth + 1)
                if try endOfContainer(UInt8(ascii: "]")) { return }
            }
        case UInt8(ascii: "\""):
            try skipString()
        default:
            _ = try readValue(depth: depth)
        }
    }

    /// Fails unless only whitespace is left.
    public mutating func expectEnd() throws(Failure) {
        skipWhitespace()
        guard index == bytes.count else { throw .malformed(offset: index) }
    }

    // MARK: Tokens

    /// After a member or element: true at the closing bracket, false after a comma.
    private mutating func endOfContainer(_ close: UInt8) throws(Failure) -> Bool {
        skipWhitespace()
        guard let byte = peek() else { throw .malformed(offset: index) }
        index += 1
        if byte == close { return true }
        if byte == UInt8(ascii: ",") { return false }
        throw .malformed(offset: index - 1)
    }

    /// Reads a string, decoding escapes.
    public mutating func string() throws(Failure) -> String {
        let start = index + 1
        let escaped = try skipString()
        let body = UnsafeRawBufferPointer(rebasing: bytes[start..<(index - 1)])
        guard escaped else { return String(decoding: body, as: UTF8.self) }
        return Self.unescape(body)
    }

    /// Skips a string, checking its grammar; returns whether it held escapes.
    @discardableResult
    private mutating func skipString() throws(Failure) -> Bool {
        guard peek() == UInt8(ascii: "\"") else { throw .malformed(offset: index) }
        index += 1
        var escaped = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return escaped
            }
            if byte < 0x20 { throw .malformed(offset: index) }
            if byte >= 0x80 {
                index += try Self.utf8SequenceLength(bytes, at: index)
                continue
            }
            if byte == UInt8(ascii: "\\") {
                escaped = true
                index += 1
                guard let next = peek() else { throw .malformed(offset: index) }
                switch next {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    let escape = index - 1
                    let code = try hex4(at: index + 1)
                    index += 5
                    if (0xDC00..<0xE000).contains(code) { throw .invalidUTF8(offset: escape) }
                    if (0xD800..<0xDC00).contains(code) {
                        // A high surrogate: its low half must follow, escaped.
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u"),
                              (0xDC00..<0xE000).contains(try hex4(at: index + 2)) else {
                            throw .invalidUTF8(offset: escape)
                        }
                        index += 6
                    }
                default:
                    throw .malformed(offset: index)
                }
                continue
            }
            index += 1
        }
        throw .malformed(offset: index)
    }

    /// The four hex digits of a `\u` escape starting at `start`.
    private func hex4(at start: Int) throws(Failure) -> UInt32 {
        guard start + 4 <= bytes.count else { throw .malformed(offset: start) }
        var code: UInt32 = 0
        for offset in 0..<4 {
            guard let digit = Self.hexValue(bytes[start + offset]) else { throw .malformed(offset: start + offset) }
            code = code << 4 | UInt32(digit)
        }
        return code
    }

    /// The length of the well-formed UTF-8 sequence of a non-ASCII character starting at
    /// `start` (RFC 3629, table 3-7 of the Unicode standard).
    private static func utf8SequenceLength(_ bytes: UnsafeRawBufferPointer, at start: Int) throws(Failure) -> Int {
        let lead = bytes[start]
        let length: Int
        var lower: UInt8 = 0x80, upper: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; lower = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; upper = 0x9F
        case 0xF0: length = 4; lower = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; upper = 0x8F
        default: throw .invalidUTF8(offset: start)
        }
        guard start + length <= bytes.count else { throw .invalidUTF8(offset: start) }
        // The second byte has the lead's own range; the others are plain continuation bytes.
        guard (lower...upper).contains(bytes[start + 1]) else { throw .invalidUTF8(offset: start) }
        for offset in 2..<length where !(0x80...0xBF).contains(bytes[start + offset]) {
            throw .invalidUTF8(offset: start)
        }
        return length
    }

    /// Decodes the escapes of a string body already checked by ``skipString()``.
    private static func unescape(_ body: UnsafeRawBufferPointer) -> String {
        var utf8: [UInt8] = []
        utf8.reserveCapacity(body.count)
        var position = 0
        func hex4(_ at: Int) -> UInt32 {
            (0..<4).reduce(0) { $0 << 4 | UInt32(hexValue(body[at + $1])!) }
        }
        while position < body.count {
            let byte = body[position]
            guard byte == UInt8(ascii: "\\") else {
                utf8.append(byte)
                position += 1
                continue
            }
            let kind = body[position + 1]
            position += 2
            switch kind {
            case UInt8(ascii: "b"): utf8.append(0x08)
            case UInt8(ascii: "f"): utf8.append(0x0C)
            case UInt8(ascii: "n"): utf8.append(0x0A)
            case UInt8(ascii: "r"): utf8.append(0x0D)
            case UInt8(ascii: "t"): utf8.append(0x09)
            case UInt8(ascii: "u"):
                var code = hex4(position)
                position += 4
                if (0xD800..<0xDC00).contains(code), position + 6 <= body.count,
                   body[position] == UInt8(ascii: "\\"), body[position + 1] == UInt8(ascii: "u") {
                    let low = hex4(position + 2)
                    if (0xDC00..<0xE000).contains(low) {
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        position += 6
                    }
                }
                UTF8.encode(Unicode.Scalar(code) ?? "\u{FFFD}") { utf8.append($0) }
            default: utf8.append(kind)  // " \ /
            }
        }
        return String(decoding: utf8, as: UTF8.self)
    }

    private mutating func number() throws(Failure) -> Value {
        let start = index
        var isInteger = true
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek(), Self.isDigit(first) else { throw .malformed(offset: index) }
        if first == UInt8(ascii: "0") {
            index += 1
        } else {
            while let byte = peek(), Self.isDigit(byte) { index += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard let byte = peek(), Self.isDigit(byte) else { throw .malformed(offset: index) }
            while let byte = peek(), Self.isDigit(byte) { index += 1 }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            guard let byte = peek(), Self.isDigit(byte) else { throw .malformed(offset: index) }
            while let byte = peek(), Self.isDigit(byte) { index += 1 }
        }
        let text = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
        if isInteger, text.count <= 18 {
            var value: Int64 = 0
            var negative = false
            for byte in text {
                if byte == UInt8(ascii: "-") { negative = true } else { value = value * 10 + Int64(byte - 0x30) }
            }
            return .integer(negative ? -value : value)
        }
        let string = String(decoding: text, as: UTF8.self)
        if isInteger, let value = Int64(string) { return .integer(value) }
        guard let value = Double(string), value.isFinite else { throw .numberOutOfRange(offset: start) }
        return .number(value)
    }

    private mutating func literal(_ word: StaticString) throws(Failure) {
        let start = word.utf8Start
        for offset in 0..<word.utf8CodeUnitCount {
            guard peek() == start[offset] else { throw .malformed(offset: index) }
            index += 1
        }
    }

    private mutating func expect(_ byte: UInt8) throws(Failure) {
        skipWhitespace()
        guard peek() == byte else { throw .malformed(offset: index) }
        index += 1
    }

    private mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private func peek() -> UInt8? {
        index < bytes.count ? bytes[index] : nil
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: byte - 0x30
        case 0x41...0x46: byte - 0x41 + 10
        case 0x61...0x66: byte - 0x61 + 10
        default: nil
        }
    }
}
