import APNs
import NIOCore
import Testing

@Suite("JSON reader", .timeLimit(.minutes(3)))
struct JSONReaderTests {
    static func read(_ json: String) throws -> JSONReader.Value {
        try Array(json.utf8).withUnsafeBytes { bytes in
            var reader = JSONReader(bytes)
            let value = try reader.readValue()
            try reader.expectEnd()
            return value
        }
    }

    static func isValid(_ json: String) -> Bool {
        Array(json.utf8).withUnsafeBytes { bytes in (try? JSONReader.validate(bytes)) != nil }
    }

    @Test func decodesEveryEscape() throws {
        #expect(try Self.read(#""a\"b\\c\/d\b\f\n\r\t""#) == .string("a\"b\\c/d\u{8}\u{C}\n\r\t"))
        #expect(try Self.read(#""caf\u00e9 \u20AC""#) == .string("café €"))
        #expect(try Self.read(#""\ud83d\ude00""#) == .string("😀"))
        #expect(try Self.read("\"plain ünïcode\"") == .string("plain ünïcode"))
    }

    /// A surrogate escaped without its pair stands for no character: the string is refused as
    /// not UTF-8, where the escape starts (found by fuzzing: such a payload passed validation).
    @Test(arguments: [#""lone \ud83d here""#, #""\ude00""#, #""\ud83d""#, #""\ud83d\u0041""#, #""\ud83d\ud83d""#, #"{"a":"\udb00x"}"#])
    func aLoneSurrogateEscapeIsNotUTF8(_ json: String) {
        let offset = json.utf8.firstIndex(of: UInt8(ascii: "\\")).map { json.utf8.distance(from: json.utf8.startIndex, to: $0) }
        #expect(throws: JSONReader.Failure.invalidUTF8(offset: offset ?? -1)) {
            try Array(json.utf8).withUnsafeBytes { try JSONReader.validate($0) }
        }
    }

    @Test func readsNumbersAndLiterals() throws {
        #expect(try Self.read("10") == .integer(10))
        #expect(try Self.read("-0") == .integer(0))
        #expect(try Self.read("9223372036854775807") == .integer(Int64.max))
        #expect(try Self.read("10.0").exactInteger == 10)
        #expect(try Self.read("1.5") == .number(1.5))
        #expect(try Self.read("1e3").exactInteger == 1000)
        #expect(try Self.read("99999999999999999999").exactInteger == nil)
        #expect(try Self.read(" true ") == .bool(true))
        #expect(try Self.read("null") == .null)
        #expect(try Self.read(#"{"a":[1,{"b":2}]}"#) == .object(0..<17))
    }

    @Test func rejectsWhatIsNotJSON() {
        for bad in ["", "{", "{\"a\"}", "{\"a\":1,}", "[1,]", "01", "1.", "-", "tru", "\"\u{01}\"", #""\x""#,
                    #""\u12""#, "{} {}", "{\"a\":1 \"b\":2}", "nul"] {
            #expect(!Self.isValid(bad), "\(bad)")
        }
        for good in ["{}", "[]", " {\"a\" : [ 1 , 2.5e-3 , \"x\" , null , false ] } ", "\"\"", "0"] {
            #expect(Self.isValid(good), "\(good)")
        }
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        #expect(throws: JSONReader.Failure.tooDeep) {
            try Array(deep.utf8).withUnsafeBytes { try JSONReader.validate($0) }
        }
    }

    @Test func compactsOnlyOutsideStrings() {
        let json = " { \"a b\" : [ 1 , \"x \\\" y\" ] ,\n\t\"c\":{ } } "
        let compacted = Array(json.utf8).withUnsafeBytes { JSONReader.compacted($0) }
        #expect(String(buffer: compacted) == #"{"a b":[1,"x \" y"],"c":{}}"#)
    }
}
