import CHiredis
package import NIOCore

/// One Redis reply.
public enum RESPValue: Sendable, Equatable {
    /// A bulk string (binary safe).
    case bulk([UInt8])
    /// A simple status reply such as `OK`.
    case status(String)
    case integer(Int64)
    /// A nil bulk or nil array.
    case null
    /// An error reply (`-ERR ...`), as Redis wrote it.
    case error(String)
    case array([RESPValue])

    /// The reply as text: bulk strings decoded as UTF-8, status replies as they are.
    public var string: String? {
        switch self {
        case .bulk(let bytes): String(decoding: bytes, as: UTF8.self)
        case .status(let text): text
        default: nil
        }
    }

    /// The reply as an integer: integer replies, and bulk strings that hold one.
    public var integer: Int64? {
        switch self {
        case .integer(let value): value
        case .bulk(let bytes): Int64(String(decoding: bytes, as: UTF8.self))
        default: nil
        }
    }

    /// A bulk string's bytes.
    public var bytes: [UInt8]? {
        if case .bulk(let bytes) = self { return bytes }
        return nil
    }

    public var array: [RESPValue]? {
        if case .array(let values) = self { return values }
        return nil
    }

    public var isNull: Bool { self == .null }
}

/// Writes commands in RESP with hiredis' formatter (its sds variant, which formats lengths
/// without printf).
enum RESPEncoder {
    /// Appends `command` (`*N\r\n$len\r\narg\r\n...`).
    static func encode(_ command: RedisCommand, into buffer: inout ByteBuffer) {
        let count = command.lengths.count
        command.bytes.withUnsafeBufferPointer { all in
            let base = UnsafeRawPointer(all.baseAddress ?? UnsafePointer(bitPattern: 1)!)
            withUnsafeTemporaryAllocation(of: UnsafePointer<CChar>?.self, capacity: count) { pointers in
                var offset = 0
                for (index, length) in command.lengths.enumerated() {
                    pointers[index] = (base + offset).assumingMemoryBound(to: CChar.self)
                    offset += length
                }
                var target: sds?
                let length = redisFormatSdsCommandArgv(&target, Int32(count), pointers.baseAddress, command.lengths)
                guard length > 0, let target else { return }
                defer { redisFreeSdsCommand(target) }
                buffer.writeBytes(UnsafeRawBufferPointer(start: target, count: Int(length)))
            }
        }
    }
}

/// Reads replies with hiredis' reply reader: bytes go in as they arrive, whole replies come out.
/// Not thread-safe; one per connection, used on its event loop.
package final class RESPDecoder {
    package struct ProtocolError: Error, CustomStringConvertible {
        package var description: String
    }

    /// The most elements an array reply may announce. hiredis (0.14, Debian's) allocates an
    /// array's element pointers as soon as its header arrives, so `*333333331` alone would take
    /// gigabytes; no reply the relay asks for comes near this.
    package static let maxElements = 1 << 20

    private let reader: UnsafeMutablePointer<redisReader>
    private var frames = FrameGuard()

    package init() {
        reader = redisReaderCreate()
    }

    deinit {
        redisReaderFree(reader)
    }

    package func feed(_ buffer: ByteBuffer) throws(ProtocolError) {
        let status = try buffer.withUnsafeReadableBytes { bytes throws(ProtocolError) in
            try frames.check(bytes)
            return redisReaderFeed(reader, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count)
        }
        guard status == REDIS_OK else { throw ProtocolError(description: errorText) }
    }

    /// Follows the reply stream's framing ahead of hiredis, only to refuse an array header
    /// past ``maxElements`` before hiredis allocates for it. Lines and bulk strings are stepped
    /// over, so no bytes inside them are taken for a header; a type byte it does not know is
    /// left to hiredis to refuse (and the guard stops looking).
    private struct FrameGuard {
        private enum State {
            case type
            /// In a line (ended by CR LF, as hiredis ends it); `number` collects an array or bulk
            /// header's digits; `cr`: the last byte was a CR.
            case line(kind: UInt8, number: Int64, negative: Bool, digits: Int, cr: Bool)
            case bulk(remaining: Int64)
            case off
        }

        private var state = State.type

        mutating func check(_ bytes: UnsafeRawBufferPointer) throws(ProtocolError) {
            var index = 0
            while index < bytes.count {
                let byte = bytes[index]
                switch state {
                case .off:
                    return
                case .type:
                    switch byte {
                    case UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: ":"), UInt8(ascii: "$"), UInt8(ascii: "*"):
                        state = .line(kind: byte, number: 0, negative: false, digits: 0, cr: false)
                    default:
                        state = .off
                    }
                    index += 1
                case .line(let kind, var number, var negative, var digits, let cr):
                    index += 1
                    if cr, byte == UInt8(ascii: "\n") {
                        let value = negative ? -number : number
                        if kind == UInt8(ascii: "*"), value > Int64(RESPDecoder.maxElements) {
                            throw ProtocolError(description: "an array reply of \(value) elements (at most \(RESPDecoder.maxElements))")
                        }
                        state = kind == UInt8(ascii: "$") && value >= 0 ? .bulk(remaining: value + 2) : .type
                        continue
                    }
                    let isNumber = kind == UInt8(ascii: "*") || kind == UInt8(ascii: "$")
                    if byte == UInt8(ascii: "\r") {
                        // hiredis reads a number line up to its CR; a CR inside one is its error.
                        state = isNumber && cr ? .off : .line(kind: kind, number: number, negative: negative, digits: digits, cr: true)
                        continue
                    }
                    guard isNumber else {
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                        continue
                    }
                    if cr {
                        state = .off  // a CR inside a number: hiredis refuses the line itself
                    } else if byte == UInt8(ascii: "-"), digits == 0, !negative {
                        negative = true
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                    } else if (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                        guard digits < 18 else { throw ProtocolError(description: "a reply length of more than 18 digits") }
                        number = number * 10 + Int64(byte - UInt8(ascii: "0"))
                        digits += 1
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                    } else {
                        state = .off  // not a number hiredis reads: it refuses the line itself
                    }
                case .bulk(let remaining):
                    let step = Int(min(remaining, Int64(bytes.count - index)))
                    index += step
                    state = remaining - Int64(step) == 0 ? .type : .bulk(remaining: remaining - Int64(step))
                }
            }
        }
    }

    /// The next complete reply, or nil when more bytes are needed.
    package func next() throws(ProtocolError) -> RESPValue? {
        var reply: UnsafeMutableRawPointer?
        guard redisReaderGetReply(reader, &reply) == REDIS_OK else { throw ProtocolError(description: errorText) }
        guard let reply else { return nil }
        defer { freeReplyObject(reply) }
        return Self.value(reply.assumingMemoryBound(to: redisReply.self).pointee)
    }

    private var errorText: String {
        withUnsafeBytes(of: reader.pointee.errstr) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    private static func value(_ reply: redisReply) -> RESPValue {
        func bytes() -> [UInt8] {
            guard let str = reply.str else { return [] }
            return Array(UnsafeRawBufferPointer(start: str, count: reply.len))
        }
        switch reply.type {
        case REDIS_REPLY_STRING: return .bulk(bytes())
        case REDIS_REPLY_STATUS: return .status(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ERROR: return .error(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_INTEGER: return .integer(reply.integer)
        case REDIS_REPLY_ARRAY:
            var values: [RESPValue] = []
            values.reserveCapacity(reply.elements)
            for index in 0..<reply.elements {
                if let element = reply.element[index] { values.append(value(element.pointee)) } else { values.append(.null) }
            }
            return .array(values)
        default: return .null
        }
    }
}
