import Common
public import Glibc
import Synchronization

/// A TCP port on 127.0.0.1 that nothing listens on right now, for a child process (a server
/// started for a test, the demo or a benchmark) to listen on: bound and released with plain
/// system calls, so it never waits on an event loop (callers may be on the concurrency pool).
/// Someone else may take it before the child binds it: callers try another then. A port is
/// handed out once per process (two servers of one test run never race for the same one).
///
/// The port is below the kernel's ephemeral range (`ip_local_port_range`), from which every
/// outgoing connection and every bind to port 0 takes its local port: a server stopped and
/// started again on the same port (a test's restart) cannot find it taken by a client's
/// connection meanwhile, which with many tests at once happened.
public enum LoopbackPort {
    public struct Unavailable: Error, CustomStringConvertible {
        public var description: String
    }

    public static func free() throws(Unavailable) -> Int {
        let below = ephemeralRangeStart()
        if below > 10_000 {
            for _ in 0..<200 {
                let port = Int.random(in: 10_000..<below)
                guard handedOut.withLock({ $0.insert(port).inserted }) else { continue }
                if try bindable(port) != nil { return port }
            }
        }
        // No room below the ephemeral range (or all of it taken): one the kernel picks.
        guard let port = try bindable(0) else { throw Unavailable(description: "bind 127.0.0.1:0: errno \(errno)") }
        return port
    }

    /// The ports below the ephemeral range tried so far in this process.
    private static let handedOut = Locked<Set<Int>>([])

    /// Binds 127.0.0.1:`port` (0: the kernel picks) and releases it; the port bound, nil when
    /// it is taken.
    static func bindable(_ port: Int) throws(Unavailable) -> Int? {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Unavailable(description: "socket: errno \(errno)") }
        defer { close(descriptor) }
        var address = address(port: port)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        return bound ? Int(UInt16(bigEndian: address.sin_port)) : nil
    }

    /// 127.0.0.1:`port` as a socket address, for `bind` and `connect`.
    public static func address(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }

    /// The first port of the kernel's ephemeral range (32768 when it cannot be read).
    private static func ephemeralRangeStart() -> Int {
        let descriptor = open("/proc/sys/net/ipv4/ip_local_port_range", O_RDONLY)
        guard descriptor >= 0 else { return 32_768 }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0, let first = String(decoding: buffer[..<count], as: UTF8.self)
            .split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first, let low = Int(first) else { return 32_768 }
        return low
    }
}
