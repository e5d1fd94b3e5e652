import CHiredis
import NIOCore
@testable import Redis
import Testing

/// The command encoder against hiredis' formatter (`redisFormatSdsCommandArgv`), the
/// reference: the same bytes for every command.
@Suite("RESP encoder", .timeLimit(.minutes(1)))
struct RESPEncoderTests {
    /// `command` as hiredis formats it.
    static func hiredis(_ command: RedisCommand) -> [UInt8] {
        command.bytes.withUnsafeBufferPointer { all in
            let base = UnsafeRawPointer(all.baseAddress ?? UnsafePointer(bitPattern: 1)!)
            var pointers: [UnsafePointer<CChar>?] = []
            var offset = 0
            for length in command.lengths {
                pointers.append((base + offset).assumingMemoryBound(to: CChar.self))
                offset += length
            }
            var target: sds?
            let length = redisFormatSdsCommandArgv(&target, Int32(command.lengths.count), &pointers, command.lengths)
            guard length > 0, let target else { return [] }
            defer { redisFreeSdsCommand(target) }
            return Array(UnsafeRawBufferPointer(start: target, count: Int(length)))
        }
    }

    static func encoded(_ command: RedisCommand) -> [UInt8] {
        var buffer = ByteBuffer()
        RESPEncoder.encode(command, into: &buffer)
        return Array(buffer.readableBytesView)
    }

    @Test func everyCommandIsHiredisBytes() {
        // Integers as Redis arguments: negative ones and the extremes.
        let integersCommand = RedisCommand("ZRANGEBYSCORE", ["k", Int64.min, Int64(-1), Int64(0), Int64.max, Int(-42)])
        var commands: [RedisCommand] = [
            RedisCommand("PING"),
            RedisCommand("GET", ["k"]),
            RedisCommand("SET", ["apns-relay:seen:{ab}:com.example.app:id-1", "2 delivered 200 - - -", "EX", 86_400, "NX"]),
            // Empty, binary (CR LF and NUL inside), and long arguments; lengths of 9, 10, 99,
            // 100, 999 and 1000 bytes (the digits' carries).
            RedisCommand("SET", ["", [0, 13, 10, 36, 42, 255] as [UInt8]]),
            RedisCommand("MSET", [9, 10, 99, 100, 999, 1000].flatMap { length -> [any RESPArgument] in
                ["key-\(length)", [UInt8](repeating: UInt8(ascii: "x"), count: length)]
            }),
            RedisCommand("DEL", (0..<12).map { "k\($0)" as any RESPArgument }),
            integersCommand,
        ]
        var built = RedisCommand("MGET", reservingBytes: 16, arguments: 2)
        built.appendArgument { $0.append(contentsOf: "apns-relay:rate:{".utf8); $0.append(contentsOf: String(repeating: "f", count: 64).utf8) }
        built.appendArgument { _ in }
        commands.append(built)
        for command in commands {
            #expect(Self.encoded(command) == Self.hiredis(command), "\(String(decoding: Self.hiredis(command).prefix(80), as: UTF8.self))")
        }
        // The integers' digits are the command's own (hiredis copies them as given): as Redis
        // reads them.
        let integers = String(decoding: Self.encoded(integersCommand), as: UTF8.self)
        #expect(integers == "*7\r\n$13\r\nZRANGEBYSCORE\r\n$1\r\nk\r\n$20\r\n-9223372036854775808\r\n$2\r\n-1\r\n"
            + "$1\r\n0\r\n$19\r\n9223372036854775807\r\n$3\r\n-42\r\n", "\(integers)")
        // A buffer of several, as a round trip sends them: one after another.
        let buffer = RedisCommandBuffer(commands)
        #expect(buffer.count == commands.count)
        #expect(Array(buffer.bytes.readableBytesView) == commands.flatMap(Self.hiredis))
    }
}
