internal import Glibc

/// A TCP port on 127.0.0.1 that nothing listens on right now, for a child process (a server
/// started for a test, the demo or a benchmark) to listen on: bound and released with plain
/// system calls, so it never waits on an event loop (callers may be on the concurrency pool).
/// Someone else may take it before the child binds it: callers try another then.
public enum LoopbackPort {
    public struct Unavailable: Error, CustomStringConvertible {
        public var description: String
    }

    public static func free() throws(Unavailable) -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Unavailable(description: "socket: errno \(errno)") }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        guard bound else { throw Unavailable(description: "bind 127.0.0.1:0: errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
