import Foundation
import Testing
@testable import Spawn

@Suite("Loopback ports for test servers", .timeLimit(.minutes(1)))
struct LoopbackPortTests {
    /// Ports come from below the kernel's ephemeral range, which outgoing connections and binds
    /// to port 0 draw from: a server started again on its port does not find a client's
    /// connection holding it. Each is free to listen on when handed out: one that cannot be
    /// bound right after is one another process took meanwhile, as the contract allows — a
    /// server it is starting, which listens on it within a second, or its own check that the
    /// port is free (every process, the relay processes tests start among them, checks ports
    /// the same way), which lets it go at once. One that stays held by nobody listening would
    /// be a port handed out that no server could take.
    @Test func portsAreFreeAndBelowTheEphemeralRange() throws {
        let range = try String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)
        let low = try #require(range.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) })
        try #require(low > 10_000, "this machine leaves no room below its ephemeral range (\(low))")
        for _ in 0..<50 {
            let port = try LoopbackPort.free()
            #expect((10_000..<low).contains(port), "\(port)")
            if let failure = Self.bindFailure(port) {
                #expect(failure == EADDRINUSE && (0..<10).contains { attempt in
                    if attempt > 0 { usleep(100_000) }
                    return Self.someoneListens(on: port) || Self.bindFailure(port) == nil
                },
                        "port \(port) was handed out but could not be bound (errno \(failure)), and for a second nothing listened on it nor let it go")
            }
        }
    }

    /// Binds 127.0.0.1:`port` and lets it go again, as ``LoopbackPort/free()`` checks a port;
    /// errno when it cannot (nil when it can).
    static func bindFailure(_ port: Int) -> Int32? {
        (try? LoopbackPort.bindable(port)) == nil ? errno : nil
    }

    /// Whether a connection to 127.0.0.1:`port` is accepted (within 100 ms: a listener whose
    /// backlog is full leaves it unanswered).
    static func someoneListens(on port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = LoopbackPort.address(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}
