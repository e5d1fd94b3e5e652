import Common
import Testing

/// ``DecimalDigits``: the digits the JSON writer and the Redis commands write.
@Suite("Decimal digits", .timeLimit(.minutes(1)))
struct DecimalDigitsTests {
    @Test func everyCarryAndTheExtremes() {
        for value: UInt64 in [0, 1, 9, 10, 99, 100, 999, 1000, 86_400, 1_700_000_000_123, UInt64(Int64.max), UInt64.max] {
            #expect(DecimalDigits.with(value) { String(decoding: $0, as: UTF8.self) } == String(value))
        }
    }

    /// The JSON writer's integers, negative ones and zero included, as Swift prints them.
    @Test func theJSONWritersIntegers() {
        for value: Int64 in [0, -1, 42, -86_400, .max, .min] {
            var writer = JSONObjectWriter(capacity: 16)
            writer.add("n", value)
            #expect(String(decoding: writer.finish(), as: UTF8.self) == #"{"n":\#(value)}"#)
        }
    }
}
