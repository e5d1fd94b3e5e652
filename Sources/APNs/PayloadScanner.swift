/// A single-pass JSON checker for notification payloads.
///
/// Validation runs on every send, so instead of building a Foundation object tree this walks
/// the bytes once: it checks that the payload is well-formed JSON (RFC 8259 grammar, nesting at
/// most ``maximumDepth`` deep), that the top level is an object, and reports what sits under
/// `aps`: whether it is an object, its keys, and the value of `content-available` when it is an
/// integer.
struct PayloadScanner {
    static let maximumDepth = 64

    struct Summary: Equatable {
        enum APS: Equatable { case missing, object, notAnObject }
        var aps: APS = .missing
        /// Keys of `aps` other than `content-available`, in order (the first 16).
        var otherAPSKeys: [String] = []
        var contentAvailable: Int?
    }

    enum Failure: Error, Equatable {
        case malformed(offset: Int)
        case notAnObject
        case tooDeep
    }

    private let bytes: UnsafeRawBufferPointer
    private let collectsKeys: Bool
    private var index = 0

    private init(_ bytes: UnsafeRawBufferPointer, collectsKeys: Bool) {
        self.bytes = bytes
        self.collectsKeys = collectsKeys
    }

    /// - Parameter collectAPSKeys: fill ``Summary/otherAPSKeys`` (costs an allocation; only
    ///   background pushes need it).
    static func scan(_ bytes: UnsafeRawBufferPointer, collectAPSKeys: Bool = false) throws(Failure) -> Summary {
        var scanner = PayloadScanner(bytes, collectsKeys: collectAPSKeys)
        scanner.skipWhitespace()
        guard scanner.peek() == UInt8(ascii: "{") else {
            // Tell a well-formed non-object from garbage.
            _ = try scanner.value(depth: 0)
            throw .notAnObject
        }
        var summary = Summary()
        try scanner.object(depth: 0, summary: &summary)
        scanner.skipWhitespace()
        guard scanner.index == bytes.count else { throw .malformed(offset: scanner.index) }
        return summary
    }

    // MARK: Grammar

    /// Walks the members of the object at `index`, calling `visit` with each key while the
    /// scanner stands at that member's value; `visit` must consume the value.
    private mutating func forEachMember(
        _ visit: (inout PayloadScanner, String) throws(Failure) -> Void
    ) throws(Failure) {
        index += 1  // {
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

    /// The top-level object: like any object, but looks into `aps`.
    private mutating func object(depth: Int, summary: inout Summary) throws(Failure) {
        try forEachMember { scanner, key throws(Failure) in
            guard key == "aps" else {
                _ = try scanner.value(depth: depth + 1)
                return
            }
            if scanner.peek() == UInt8(ascii: "{") {
                summary.aps = .object
                try scanner.apsObject(depth: depth + 1, summary: &summary)
            } else {
                summary.aps = .notAnObject
                _ = try scanner.value(depth: depth + 1)
            }
        }
    }

    private mutating func apsObject(depth: Int, summary: inout Summary) throws(Failure) {
        summary.otherAPSKeys = []
        summary.contentAvailable = nil
        let collectsKeys = self.collectsKeys
        try forEachMember { scanner, key throws(Failure) in
            let integer = try scanner.value(depth: depth + 1)
            if key == "content-available" {
                summary.contentAvailable = integer
            } else if collectsKeys, summary.otherAPSKeys.count < 16 {
                summary.otherAPSKeys.append(key)
            }
        }
    }

    /// Skips one value; returns it when it is a small integer.
    private mutating func value(depth: Int) throws(Failure) -> Int? {
        guard depth < Self.maximumDepth else { throw .tooDeep }
        skipWhitespace()
        guard let byte = peek() else { throw .malformed(offset: index) }
        switch byte {
        case UInt8(ascii: "{"):
            try forEachMember { scanner, _ throws(Failure) in _ = try scanner.value(depth: depth + 1) }
            return nil
        case UInt8(ascii: "["):
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") {
                index += 1
                return nil
            }
            while true {
                _ = try value(depth: depth + 1)
                if try endOfContainer(UInt8(ascii: "]")) { return nil }
            }
        case UInt8(ascii: "\""):
            _ = try string()
            return nil
        case UInt8(ascii: "t"): try literal("true"); return nil
        case UInt8(ascii: "f"): try literal("false"); return nil
        case UInt8(ascii: "n"): try literal("null"); return nil
        default:
            return try number()
        }
    }

    /// After a member or element: true at the closing bracket, false after a comma.
    private mutating func endOfContainer(_ close: UInt8) throws(Failure) -> Bool {
        skipWhitespace()
        guard let byte = peek() else { throw .malformed(offset: index) }
        index += 1
        if byte == close { return true }
        if byte == UInt8(ascii: ",") { return false }
        throw .malformed(offset: index - 1)
    }

    private mutating func string() throws(Failure) -> String {
        guard peek() == UInt8(ascii: "\"") else { throw .malformed(offset: index) }
        index += 1
        let start = index
        var escaped = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let text = escaped
                    ? "\u{FFFD}"  // keys with escapes never match the names we look for
                    : String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return text
            }
            if byte < 0x20 { throw .malformed(offset: index) }
            if byte == UInt8(ascii: "\\") {
                escaped = true
                index += 1
                guard let next = peek() else { throw .malformed(offset: index) }
                switch next {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    guard index + 4 < bytes.count else { throw .malformed(offset: index) }
                    for offset in 1...4 where !isHexDigit(bytes[index + offset]) { throw .malformed(offset: index + offset) }
                    index += 5
                default:
                    throw .malformed(offset: index)
                }
                continue
            }
            index += 1
        }
        throw .malformed(offset: index)
    }

    private mutating func number() throws(Failure) -> Int? {
        let start = index
        var isInteger = true
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek(), isDigit(first) else { throw .malformed(offset: index) }
        if first == UInt8(ascii: "0") {
            index += 1
        } else {
            while let byte = peek(), isDigit(byte) { index += 1 }
        }
        if peek() == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard let byte = peek(), isDigit(byte) else { throw .malformed(offset: index) }
            while let byte = peek(), isDigit(byte) { index += 1 }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            guard let byte = peek(), isDigit(byte) else { throw .malformed(offset: index) }
            while let byte = peek(), isDigit(byte) { index += 1 }
        }
        guard isInteger, index - start <= 18 else { return nil }
        var value = 0
        var negative = false
        for position in start..<index {
            let byte = bytes[position]
            if byte == UInt8(ascii: "-") { negative = true } else { value = value * 10 + Int(byte - 0x30) }
        }
        return negative ? -value : value
    }

    private mutating func literal(_ word: String) throws(Failure) {
        for expected in word.utf8 {
            guard peek() == expected else { throw .malformed(offset: index) }
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

    private func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }
}
