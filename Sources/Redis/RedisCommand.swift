import Common
import Crypto
import Foundation
import NIOCore

/// Something that goes into a command as one RESP bulk string.
public protocol RESPArgument {
    /// Appends the argument's bytes.
    func appendRESP(to bytes: inout [UInt8])
}

extension String: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: utf8) } }
extension Substring: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: utf8) } }
extension Int: RESPArgument { public func appendRESP(to bytes: inout [UInt8]) { Int64(self).appendRESP(to: &bytes) } }
extension Int64: RESPArgument {
    /// Decimal digits, written in place (no string made).
    public func appendRESP(to bytes: inout [UInt8]) { DecimalDigits.append(self, to: &bytes) }
}
extension Array: RESPArgument where Element == UInt8 { public func appendRESP(to bytes: inout [UInt8]) { bytes.append(contentsOf: self) } }

/// One Redis command: its name and arguments, kept as one byte array and the arguments'
/// lengths. Hot paths build a command argument by argument into reserved room (no argument
/// array, no key strings): ``init(_:reservingBytes:arguments:)`` and the `append` methods.
public struct RedisCommand: Sendable, Equatable {
    /// Every argument's bytes, one after another (the command name first).
    var bytes: [UInt8]
    var lengths: [Int]

    public init(_ name: String, _ arguments: [any RESPArgument] = []) {
        self.init(name, reservingBytes: 16 * (arguments.count + 1), arguments: arguments.count)
        for argument in arguments { append(argument) }
    }

    /// An empty command named `name`, with room for `reservingBytes` bytes of arguments and
    /// `arguments` arguments.
    public init(_ name: String, reservingBytes: Int, arguments: Int) {
        bytes = []
        bytes.reserveCapacity(name.utf8.count + reservingBytes)
        lengths = []
        lengths.reserveCapacity(arguments + 1)
        append(name)
    }

    public mutating func append(_ argument: some RESPArgument) {
        appendArgument { argument.appendRESP(to: &$0) }
    }

    /// Empties the command (keeping its room) and names it `name`.
    mutating func reset(_ name: String) {
        bytes.removeAll(keepingCapacity: true)
        lengths.removeAll(keepingCapacity: true)
        append(name)
    }

    /// Appends one argument written in pieces by `write` (a key made of a prefix, a token and
    /// a topic, say), without an intermediate string.
    public mutating func appendArgument(_ write: (inout [UInt8]) -> Void) {
        let start = bytes.count
        write(&bytes)
        lengths.append(bytes.count - start)
    }

    /// `EVALSHA sha numkeys keys... arguments...`
    public static func evalsha(_ script: RedisScript, keys: [any RESPArgument], arguments: [any RESPArgument]) -> RedisCommand {
        var command = RedisCommand("EVALSHA", reservingBytes: 48 + 32 * (keys.count + arguments.count),
                                   arguments: 2 + keys.count + arguments.count)
        command.append(script.sha1)
        command.append(keys.count)
        for key in keys { command.append(key) }
        for argument in arguments { command.append(argument) }
        return command
    }
}

/// Commands encoded in RESP (``RESPEncoder``) into one buffer as they are added, to be sent
/// in one round trip. Hot paths build each command in the buffer's reused scratch command
/// (``append(_:_:)``), so building allocates nothing once the room has grown.
public struct RedisCommandBuffer: Sendable {
    var bytes: ByteBuffer
    /// Commands encoded so far.
    public internal(set) var count = 0
    private var scratch = RedisCommand("", reservingBytes: 256, arguments: 16)

    public init(reservingBytes: Int = 1024) {
        bytes = ByteBufferAllocator().buffer(capacity: reservingBytes)
    }

    public init(_ commands: [RedisCommand]) {
        self.init(reservingBytes: commands.reduce(0) { $0 + $1.bytes.count + 16 * $1.lengths.count })
        for command in commands { append(command) }
    }

    public var isEmpty: Bool { count == 0 }

    /// How many bytes the commands take as they go out.
    package var encodedByteCount: Int { bytes.readableBytes }

    public mutating func append(_ command: RedisCommand) {
        RESPEncoder.encode(command, into: &bytes)
        count += 1
    }

    /// Appends the commands another buffer encoded, after these.
    public mutating func append(contentsOf other: RedisCommandBuffer) {
        var encoded = other.bytes
        bytes.writeBuffer(&encoded)
        count += other.count
    }

    /// Builds a command named `name` with `build` and encodes it.
    public mutating func append(_ name: String, _ build: (inout RedisCommand) -> Void) {
        scratch.reset(name)
        build(&scratch)
        RESPEncoder.encode(scratch, into: &bytes)
        count += 1
    }
}

/// A Lua script, run with EVALSHA by its SHA-1 and loaded (SCRIPT LOAD) when Redis answers
/// NOSCRIPT — on first use and after Redis lost its script cache (restart, SCRIPT FLUSH).
public struct RedisScript: Sendable {
    public let source: String
    public let sha1: String

    public init(_ source: String) {
        self.source = source
        self.sha1 = Insecure.SHA1.hash(data: Array(source.utf8)).map { String(format: "%02x", $0) }.joined()
    }
}
