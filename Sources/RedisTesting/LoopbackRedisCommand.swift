import Foundation
import Spawn
#if canImport(Glibc)
import Glibc
#endif

/// One command to a Redis server on 127.0.0.1 over a blocking socket of its own, for the test
/// clusters' bookkeeping (is every node settled, who serves a slot, a node's id): what
/// `redis-cli -p port args...` did, without a process per command. Polling a cluster until it
/// settles ran several hundred `redis-cli` processes per cluster; they were a tenth of the
/// suite's CPU.
///
/// The reply reads as `redis-cli` prints it when its output is not a terminal: a string or a
/// number as it is, a nil as an empty line, an array's elements one per line (nested arrays
/// flattened), an error as its message. Every read and write has a deadline (`timeout`).
public enum LoopbackRedisCommand {
    public struct Failed: Error, CustomStringConvertible {
        public var description: String
    }

    public static func run(port: Int, _ arguments: [String], timeout: Duration = .seconds(10)) throws(Failed) -> String {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failed(description: "socket: errno \(errno)") }
        defer { close(descriptor) }
        var limit = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: Int(timeout.components.attoseconds / 1_000_000_000_000))
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        var address = LoopbackPort.address(port: port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else { throw Failed(description: "connect 127.0.0.1:\(port): errno \(errno)") }

        var request = Array("*\(arguments.count)\r\n".utf8)
        for argument in arguments {
            let bytes = Array(argument.utf8)
            request += Array("$\(bytes.count)\r\n".utf8) + bytes + Array("\r\n".utf8)
        }
        var written = 0
        while written < request.count {
            let count = request[written...].withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { throw Failed(description: "\(arguments.first ?? "") to port \(port): write failed, errno \(errno)") }
            written += count
        }

        var reply: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            var index = 0
            if let lines = try parse(reply, at: &index), index == reply.count {
                return lines.joined(separator: "\n") + "\n"
            }
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                throw Failed(description: "\(arguments.first ?? "") to port \(port): "
                    + (count == 0 ? "the server closed the connection" : "no complete reply within \(timeout) (errno \(errno))"))
            }
            reply += chunk[..<count]
        }
    }

    /// The reply starting at `index`, as lines, with `index` moved past it; nil while it is
    /// incomplete.
    static func parse(_ bytes: [UInt8], at index: inout Int) throws(Failed) -> [String]? {
        guard index < bytes.count, let end = lineEnd(bytes, from: index + 1) else { return nil }
        let line = String(decoding: bytes[(index + 1)..<end], as: UTF8.self)
        let kind = bytes[index]
        index = end + 2
        switch kind {
        case UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: ":"):
            return [line]
        case UInt8(ascii: "$"):
            guard let length = Int(line) else { throw Failed(description: "a bulk length that is not a number: \(line)") }
            if length < 0 { return [""] }
            guard bytes.count >= index + length + 2 else { return nil }
            defer { index += length + 2 }
            return [String(decoding: bytes[index..<(index + length)], as: UTF8.self)]
        case UInt8(ascii: "*"):
            guard let count = Int(line) else { throw Failed(description: "an array length that is not a number: \(line)") }
            var lines: [String] = []
            for _ in 0..<max(count, 0) {
                guard let element = try parse(bytes, at: &index) else { return nil }
                lines += element
            }
            return count < 0 ? [""] : lines
        default:
            throw Failed(description: "a reply of unknown kind \(kind)")
        }
    }

    private static func lineEnd(_ bytes: [UInt8], from start: Int) -> Int? {
        var position = start
        while position + 1 < bytes.count {
            if bytes[position] == UInt8(ascii: "\r") && bytes[position + 1] == UInt8(ascii: "\n") { return position }
            position += 1
        }
        return nil
    }
}
