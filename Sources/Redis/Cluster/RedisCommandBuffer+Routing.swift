import NIOCore

extension RedisCommandBuffer {
    /// One encoded command of the buffer: where its bytes are, and the hash slot of its key
    /// (nil for a command without one, such as `SCRIPT LOAD`, `INFO` or `EVAL` without keys).
    struct Routed: Sendable, Equatable {
        var range: Range<Int>
        var slot: Int?
        /// A keyless command for every node the call reaches (``everyNode``).
        var everyNode = false
    }

    /// Keyless commands that go to every node a call reaches (a master when it reaches none):
    /// a script loaded where the call's scripts run, `WAIT` where its writes went.
    static let everyNode: Set<String> = ["CONFIG", "DBSIZE", "FLUSHALL", "FLUSHDB", "INFO", "PING", "SCRIPT", "WAIT"]

    /// Commands that name no key besides those: they go to one node (`EVAL` without keys
    /// too). Others are routed by their first argument.
    static let keyless: Set<String> = [
        "ASKING", "AUTH", "CLIENT", "CLUSTER", "COMMAND", "DISCARD", "ECHO", "EXEC", "FUNCTION", "HELLO", "LASTSAVE",
        "MULTI", "READONLY", "READWRITE", "ROLE", "SCAN", "SELECT", "TIME",
    ]

    /// The buffer's commands, read back from their RESP encoding (`*N` then N bulk strings),
    /// each with its key's slot: the first key of `EVAL`/`EVALSHA`/`FCALL` (after the script
    /// and the key count), none for the keyless commands above, else the first argument.
    func routed() throws(RedisError) -> [Routed] {
        var commands: [Routed] = []
        commands.reserveCapacity(count)
        let parsed: Bool = bytes.withUnsafeReadableBytes { raw in
            var position = 0
            func number(after marker: UInt8) -> Int? {
                guard position < raw.count, raw[position] == marker else { return nil }
                position += 1
                var value = 0
                while position < raw.count, raw[position] != UInt8(ascii: "\r") {
                    let digit = Int(raw[position]) - Int(UInt8(ascii: "0"))
                    guard (0...9).contains(digit), value < Int.max / 16 else { return nil }
                    value = value * 10 + digit
                    position += 1
                }
                position += 2
                return position <= raw.count ? value : nil
            }
            func argument() -> Range<Int>? {
                guard let length = number(after: UInt8(ascii: "$")), position + length + 2 <= raw.count else { return nil }
                defer { position += length + 2 }
                return position..<(position + length)
            }
            while position < raw.count {
                let start = position
                guard let count = number(after: UInt8(ascii: "*")), count >= 1 else { return false }
                var arguments: [Range<Int>] = []
                arguments.reserveCapacity(min(count, 4))
                for _ in 0..<count {
                    guard let range = argument() else { return false }
                    if arguments.count < 4 { arguments.append(range) }
                }
                let name = String(decoding: raw[arguments[0]], as: UTF8.self).uppercased()
                var key: Range<Int>?
                if name.hasPrefix("EVAL") || name.hasPrefix("FCALL") {
                    if arguments.count >= 4, let keys = Int(String(decoding: raw[arguments[2]], as: UTF8.self)), keys >= 1 {
                        key = arguments[3]
                    }
                } else if !Self.keyless.contains(name), !Self.everyNode.contains(name), arguments.count >= 2 {
                    key = arguments[1]
                }
                commands.append(Routed(range: start..<position, slot: key.map { RedisHashSlot.of(UnsafeRawBufferPointer(rebasing: raw[$0])) },
                                       everyNode: Self.everyNode.contains(name)))
            }
            return true
        }
        guard parsed, commands.count == count else { throw .protocolError("a command buffer that is not RESP") }
        return commands
    }

    /// A buffer of some of this one's commands (``routed()``'s ranges), in the order given.
    func subset(_ commands: some Sequence<Routed>, prefix: RedisCommand? = nil) -> RedisCommandBuffer {
        var subset = RedisCommandBuffer(reservingBytes: 256)
        for command in commands {
            if let prefix { subset.append(prefix) }
            var slice = bytes.getSlice(at: bytes.readerIndex + command.range.lowerBound, length: command.range.count)!
            subset.bytes.writeBuffer(&slice)
            subset.count += 1
        }
        return subset
    }
}
