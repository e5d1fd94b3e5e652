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

    /// Every kind of reply, nested, and each reply however the reads cut it (every byte a read
    /// of its own too): the values come out whole, in order, and the decoder keeps nothing of
    /// one reply for the next.
    @Test func everyKindOfReplyComesOutWholeHoweverTheReadsCutIt() throws {
        let stream = "+OK\r\n-ERR wrong type\r\n:-42\r\n$5\r\nhello\r\n$0\r\n\r\n$-1\r\n*-1\r\n*0\r\n"
            + "*4\r\n:1732000000123\r\n$-1\r\n*2\r\n$1\r\na\r\n*0\r\n$4\r\nb\r\nc\r\n"
            + "*3\r\n*1\r\n*1\r\n:7\r\n+QUEUED\r\n-MOVED 3999 127.0.0.1:6381\r\n:0\r\n"
        let expected: [RESPValue] = [
            .status("OK"), .error("ERR wrong type"), .integer(-42), .bulk(Array("hello".utf8)), .bulk([]), .null, .null, .array([]),
            .array([.integer(1_732_000_000_123), .null, .array([.bulk(Array("a".utf8)), .array([])]), .bulk(Array("b\r\nc".utf8))]),
            .array([.array([.array([.integer(7)])]), .status("QUEUED"), .error("MOVED 3999 127.0.0.1:6381")]), .integer(0),
        ]
        #expect(try Self.decode([stream]) == expected)
        #expect(try Self.decode(stream.map { String($0) }) == expected, "a byte at a time")
        let bytes = Array(stream.utf8)
        for cut in stride(from: 1, to: bytes.count, by: 3) {
            let pieces = [String(decoding: bytes[..<cut], as: UTF8.self), String(decoding: bytes[cut...], as: UTF8.self)]
            #expect(try Self.decode(pieces) == expected, "cut at \(cut)")
        }
    }

    /// A reply nested deeper than hiredis reads is a protocol error, and so is a type byte no
    /// RESP2 reply has; the decoder stays refused after it (its connection is closed).
    @Test func whatHiredisRefusesIsAProtocolError() throws {
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode([String(repeating: "*1\r\n", count: 9) + ":1\r\n"]) }
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode(["!5\r\n"]) }
        #expect(throws: RESPDecoder.ProtocolError.self) { try Self.decode([":1\r\n*2\r\n:1\r\n", "?\r\n", ":2\r\n"]) }
    }

    /// A length no Redis writes is refused before hiredis reads it as another one (hiredis
    /// 0.14 reads `*1x` as a nil array, and a count past `Int32` as a negative one); a nil
    /// array inside an array is an element like a nil bulk string.
    @Test func aLengthNoRedisWritesIsAProtocolError() throws {
        for header in ["*1x\r\n", "*-2\r\n", "*\r\n", "$\r\n", "*1\r2\r\n", "$1-\r\n", "*2147483648\r\n", "$3\r\r\nabc\r\n"] {
            #expect(throws: RESPDecoder.ProtocolError.self, "\(header.debugDescription)") { try Self.decode([header, "*2\r\n:1\r\n:2\r\n"]) }
        }
        #expect(try Self.decode(["*2\r\n*-1\r\n$-1\r\n", "*1\r\n*-1\r\n"]) == [.array([.null, .null]), .array([.null])])
    }
}
