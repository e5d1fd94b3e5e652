import CHiredis
import Common
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

/// Writes commands in RESP's request form, straight into the round trip's buffer.
///
/// Not hiredis' formatter (`redisFormatSdsCommandArgv`), which builds each command in an sds
/// string of its own (allocations, a reallocation and a free per command, then a copy into the
/// buffer; docs/performance.md, "Redis commands written without hiredis' formatter"). The form
/// is three lines of the protocol's specification; `RESPEncoderTests` checks every byte against
/// hiredis' formatter, which stays the reference.
enum RESPEncoder {
    /// Appends `command` (`*N\r\n$len\r\narg\r\n...`).
    static func encode(_ command: RedisCommand, into buffer: inout ByteBuffer) {
        let lengths = command.lengths
        // Each count or length takes at most 20 digits and 3 bytes around them; an argument
        // 2 more.
        buffer.reserveCapacity(minimumWritableBytes: command.bytes.count + 25 * (lengths.count + 1))
        writeLine(UInt8(ascii: "*"), lengths.count, into: &buffer)
        command.bytes.withUnsafeBytes { all in
            var offset = 0
            for length in lengths {
                writeLine(UInt8(ascii: "$"), length, into: &buffer)
                buffer.writeBytes(UnsafeRawBufferPointer(rebasing: all[offset..<(offset + length)]))
                buffer.writeInteger(crlf)
                offset += length
            }
        }
    }

    /// `\r\n` as one big-endian integer.
    private static let crlf: UInt16 = 0x0D0A

    /// `marker`, `count` in decimal, CR LF.
    private static func writeLine(_ marker: UInt8, _ count: Int, into buffer: inout ByteBuffer) {
        buffer.writeInteger(marker)
        DecimalDigits.with(UInt64(count)) { _ = buffer.writeBytes($0) }
        buffer.writeInteger(crlf)
    }
}

/// Reads replies with hiredis' reply reader: bytes go in as they arrive, whole replies come out.
/// Not thread-safe; one per connection, used on its event loop.
///
/// hiredis parses; the values are built in Swift as it reads them, through its reply object
/// functions (`redisReaderCreateWithFunctions`), instead of hiredis allocating a `redisReply`
/// per element and its text, which were then copied into Swift values and freed: an admission
/// read's reply (an array of four) took 9 allocations that way and takes 2 now (its array and
/// its one bulk string; `RESP decode` in Benchmarks/allocation-budgets), a `+OK` took 2 and takes
/// none.
package final class RESPDecoder {
    package struct ProtocolError: Error, CustomStringConvertible {
        package var description: String
    }

    /// The most elements an array reply may announce: no reply the relay asks for comes near
    /// it. (With its own reply objects, hiredis 0.14, Debian's, allocated an array's element
    /// pointers as soon as its header arrived, so `*333333331` alone took gigabytes; the
    /// decoder's own arrays make room for at most a thousand elements ahead.)
    package static let maxElements = 1 << 20

    private let reader: UnsafeMutablePointer<redisReader>
    private let functions: UnsafeMutablePointer<redisReplyObjectFunctions>
    private var frames = FrameGuard()
    /// The arrays of the reply being read, outermost first, each with the count its header
    /// announced; its storage is kept from reply to reply.
    private var open: [(values: [RESPValue], count: Int)] = []
    /// The last reply read whole, until ``next()`` takes it.
    private var finished: RESPValue?

    package init() {
        functions = .allocate(capacity: 1)
        functions.initialize(to: redisReplyObjectFunctions(
            createString: { task, text, length in
                guard let task else { return nil }
                let bytes = UnsafeRawBufferPointer(start: text, count: length)
                let value: RESPValue = switch task.pointee.type {
                case REDIS_REPLY_STATUS: .status(String(decoding: bytes, as: UTF8.self))
                case REDIS_REPLY_ERROR: .error(String(decoding: bytes, as: UTF8.self))
                default: .bulk(length == 0 ? [] : Array(bytes))
                }
                return RESPDecoder.from(task).read(value)
            },
            createArray: { task, count in
                guard let task else { return nil }
                return RESPDecoder.from(task).readArray(Int(count))
            },
            createInteger: { task, value in
                guard let task else { return nil }
                return RESPDecoder.from(task).read(.integer(value))
            },
            createNil: { task in
                guard let task else { return nil }
                return RESPDecoder.from(task).read(.null)
            },
            // What the functions return is a marker, not an object: nothing to free.
            freeObject: { _ in }))
        reader = redisReaderCreateWithFunctions(functions)
        open.reserveCapacity(4)
        reader.pointee.privdata = Unmanaged.passUnretained(self).toOpaque()
    }

    deinit {
        redisReaderFree(reader)
        functions.deinitialize(count: 1)
        functions.deallocate()
    }

    /// The decoder whose reader runs `task` (its reader's private data, which hiredis hands to
    /// every task of a reply).
    private static func from(_ task: UnsafePointer<redisReadTask>) -> RESPDecoder {
        Unmanaged<RESPDecoder>.fromOpaque(task.pointee.privdata).takeUnretainedValue()
    }

    /// What hiredis keeps as an element's object: any pointer but null (null is its
    /// out-of-memory error). The values themselves are in ``open`` and ``finished``.
    private static var marker: UnsafeMutableRawPointer? { UnsafeMutableRawPointer(bitPattern: 1) }

    /// A value hiredis read: into the innermost open array, closing each array it fills, or,
    /// outside any array, the reply.
    private func read(_ value: RESPValue) -> UnsafeMutableRawPointer? {
        var value = value
        while !open.isEmpty {
            let last = open.count - 1
            open[last].values.append(value)
            guard open[last].values.count == open[last].count else { return Self.marker }
            value = .array(open.removeLast().values)
        }
        finished = value
        return Self.marker
    }

    /// An array's header: empty, it is a value at once; otherwise it stays open for its elements.
    private func readArray(_ count: Int) -> UnsafeMutableRawPointer? {
        // hiredis hands a nil array to `createNil`; a negative count here is a header past
        // `Int32` (the guard refuses more than ``maxElements``): null makes it hiredis' error.
        guard count >= 0 else { return nil }
        guard count > 0 else { return read(.array([])) }
        var values: [RESPValue] = []
        // Room for what a header announces only up to a thousand: beyond, room grows with the
        // elements that arrive, not with what a header claims.
        values.reserveCapacity(min(count, 1024))
        open.append((values, count))
        return Self.marker
    }

    package func feed(_ buffer: ByteBuffer) throws(ProtocolError) {
        let status = try buffer.withUnsafeReadableBytes { bytes throws(ProtocolError) in
            try frames.check(bytes)
            return redisReaderFeed(reader, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count)
        }
        guard status == REDIS_OK else { throw ProtocolError(description: errorText) }
    }

    /// Follows the reply stream's framing ahead of hiredis, to refuse an array header past
    /// ``maxElements`` and a length no Redis writes (no digits, a sign or a CR inside, an
    /// array of fewer than −1 elements), which hiredis 0.14 would read as some other length.
    /// Lines and bulk strings are stepped over, so no bytes inside them are taken for a
    /// header; a type byte it does not know is left to hiredis to refuse (and the guard stops
    /// looking).
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
                        if kind == UInt8(ascii: "*") || kind == UInt8(ascii: "$"), digits == 0 {
                            throw ProtocolError(description: "a reply length without digits")
                        }
                        if kind == UInt8(ascii: "*"), value > Int64(RESPDecoder.maxElements) || value < -1 {
                            throw ProtocolError(description: "an array reply of \(value) elements (at most \(RESPDecoder.maxElements))")
                        }
                        state = kind == UInt8(ascii: "$") && value >= 0 ? .bulk(remaining: value + 2) : .type
                        continue
                    }
                    let isNumber = kind == UInt8(ascii: "*") || kind == UInt8(ascii: "$")
                    if byte == UInt8(ascii: "\r") {
                        // hiredis reads a length up to its CR and takes what it makes of the
                        // rest: a length no Redis writes is refused here, so that what hiredis
                        // reads and what this guard follows never part.
                        if isNumber && cr { throw ProtocolError(description: "a CR inside a reply length") }
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: true)
                        continue
                    }
                    guard isNumber else {
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                        continue
                    }
                    if cr {
                        throw ProtocolError(description: "a CR inside a reply length")
                    } else if byte == UInt8(ascii: "-"), digits == 0, !negative {
                        negative = true
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                    } else if (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                        guard digits < 18 else { throw ProtocolError(description: "a reply length of more than 18 digits") }
                        number = number * 10 + Int64(byte - UInt8(ascii: "0"))
                        digits += 1
                        state = .line(kind: kind, number: number, negative: negative, digits: digits, cr: false)
                    } else {
                        throw ProtocolError(description: "a reply length that is not a number")
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
        guard redisReaderGetReply(reader, &reply) == REDIS_OK else {
            open.removeAll(keepingCapacity: true)
            finished = nil
            throw ProtocolError(description: errorText)
        }
        guard reply != nil else { return nil }
        guard let value = finished else {
            // hiredis ended a reply that was not built: the functions and the reader disagree.
            assertionFailure("hiredis returned a reply the decoder did not build")
            throw ProtocolError(description: "a reply the decoder did not build")
        }
        finished = nil
        return value
    }

    private var errorText: String {
        withUnsafeBytes(of: reader.pointee.errstr) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }
}
