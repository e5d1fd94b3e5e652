import NIOCore
import Redis
import Testing

/// The reply decoder against what no Redis should send.
@Suite("RESP decoder", .timeLimit(.minutes(3)))
struct RESPDecoderTests {
    static func decode(_ pieces: [String]) throws(RESPDecoder.ProtocolError) -> [RESPValue] {
        let decoder = RESPDecoder()
        var values: [RESPValue] = []
        for piece in pieces {
            try decoder.feed(ByteBuffer(string: piece))
            while let value = try decoder.next() { values.append(value) }
        }
        return values
    }

    /// hiredis allocates an array's elements as soon as its header arrives: a header of a
    /// third of a billion elements would take gigabytes (found by fuzzing). Such a header is a
    /// protocol error, even split across reads; bulk strings and other lines are not mistaken
    /// for headers.
    @Test func anArrayHeaderPastTheLimitIsAProtocolError() throws {
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode(["*333333331\r\n"]) }
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode(["*1\r\n*3333", "33331\r\n"]) }
        // A line ends at CR LF only, as hiredis reads it: a lone LF inside one is not its end.
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode(["+a\nb\r\n*333333331\r\n"]) }
        #expect(try Self.decode(["$12\r\n*333333331\r\n\r\n", "+*333333331\r\n", "*2\r\n:1\r\n$-1\r\n"])
            == [.bulk(Array("*333333331\r\n".utf8)), .status("*333333331"), .array([.integer(1), .null])])
        #expect(try Self.decode(["*\(RESPDecoder.maxElements)\r\n"]) == [])
    }
}
