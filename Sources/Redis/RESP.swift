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

    private let reader: UnsafeMutablePointer<redisReader>

    package init() {
        reader = redisReaderCreate()
    }

    deinit {
        redisReaderFree(reader)
    }

    package func feed(_ buffer: ByteBuffer) throws(ProtocolError) {
        let status = buffer.withUnsafeReadableBytes { bytes in
            redisReaderFeed(reader, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count)
        }
        guard status == REDIS_OK else { throw ProtocolError(description: errorText) }
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
