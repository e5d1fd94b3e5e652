/// Protocol Buffers' wire format, as far as a collector's decoding of an OTLP export needs it:
/// the fields of one message, each with its number and its value by wire type
/// (protobuf.dev/programming-guides/encoding). Malformed input throws; nothing is skipped
/// silently.
enum ProtobufFields {
    enum Value {
        case varint(UInt64)
        case fixed64(UInt64)
        case bytes([UInt8])
        case fixed32(UInt32)
    }

    struct Malformed: Error, CustomStringConvertible {
        var description: String
    }

    static func parse(_ bytes: [UInt8]) throws -> [(number: Int, value: Value)] {
        var fields: [(number: Int, value: Value)] = []
        var index = 0
        func varint() throws -> UInt64 {
            var result: UInt64 = 0
            for shift in stride(from: 0, to: 64, by: 7) {
                guard index < bytes.count else { throw Malformed(description: "a varint runs past the end") }
                let byte = bytes[index]
                index += 1
                result |= UInt64(byte & 0x7F) << UInt64(shift)
                if byte & 0x80 == 0 { return result }
            }
            throw Malformed(description: "a varint longer than 10 bytes")
        }
        func fixed(_ count: Int) throws -> UInt64 {
            guard bytes.count - index >= count else { throw Malformed(description: "a fixed field runs past the end") }
            defer { index += count }
            return (0..<count).reduce(UInt64(0)) { $0 | UInt64(bytes[index + $1]) << UInt64(8 * $1) }
        }
        while index < bytes.count {
            let key = try varint()
            let number = Int(key >> 3)
            guard number > 0 else { throw Malformed(description: "field number 0") }
            switch key & 7 {
            case 0: fields.append((number, .varint(try varint())))
            case 1: fields.append((number, .fixed64(try fixed(8))))
            case 2:
                let length = try varint()
                guard length <= UInt64(bytes.count - index) else { throw Malformed(description: "a field of \(length) bytes runs past the end") }
                fields.append((number, .bytes(Array(bytes[index..<index + Int(length)]))))
                index += Int(length)
            case 5: fields.append((number, .fixed32(UInt32(try fixed(4)))))
            default: throw Malformed(description: "wire type \(key & 7) of field \(number)")
            }
        }
        return fields
    }

    /// The embedded messages in field `number` (a repeated message field), in order.
    static func messages(_ number: Int, in bytes: [UInt8]) throws -> [[UInt8]] {
        try parse(bytes).compactMap { field in
            guard field.number == number else { return nil }
            guard case .bytes(let message) = field.value else { throw Malformed(description: "field \(number) is not a message") }
            return message
        }
    }
}
