/// The decimal digits of a number, written into room on the stack (no string made): the one
/// routine the JSON writer, Redis command arguments, RESP's request lines and the badge count
/// written into a payload share.
public enum DecimalDigits {
    /// Appends `value` in decimal, with a leading `-` when negative.
    @inlinable
    public static func append(_ value: Int64, to bytes: inout [UInt8]) {
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        with(value.magnitude) { bytes.append(contentsOf: $0) }
    }

    /// Calls `body` with the ASCII digits of `magnitude`, most significant first.
    @inlinable
    public static func with<Result>(_ magnitude: UInt64, _ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        // 24 bytes: room for UInt64.max's 20 digits.
        var room: (UInt64, UInt64, UInt64) = (0, 0, 0)
        return try withUnsafeMutableBytes(of: &room) { buffer in
            var value = magnitude, start = buffer.count
            repeat {
                start -= 1
                buffer[start] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            } while value > 0
            return try body(UnsafeRawBufferPointer(rebasing: buffer[start...]))
        }
    }
}
