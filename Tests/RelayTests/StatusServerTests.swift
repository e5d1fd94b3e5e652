import NIOCore
import NIOPosix
import Prometheus
@testable import Relay
import TestSupport
import Testing

/// The status endpoints against clients that hold connections open, trickle bytes, or come in
/// too many: probes still get their answer.
@Suite("Status endpoints under load", .timeLimit(.minutes(3)))
struct StatusServerTests {
    struct Fine: RelayStatus {
        var notAliveReason: String? { nil }
        var notReadyReason: String? { nil }
    }

    static func start(_ limits: StatusServer.Limits) async throws -> StatusServer {
        try await StatusServer.start(host: "127.0.0.1", port: 0, registry: PrometheusCollectorRegistry(), status: Fine(),
                                     limits: limits)
    }

    /// A TCP connection that sends nothing unless told.
    static func connect(_ port: Int) async throws -> any Channel {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port).get()
    }

    @Test func twoThousandIdleConnectionsDoNotKeepProbesOut() async throws {
        let server = try await Self.start(.init(requestTimeout: .seconds(120)))
        var idle: [any Channel] = []
        for _ in 0..<2000 { idle.append(try await Self.connect(server.port)) }
        let health = try await httpGet(port: server.port, path: "/healthz")
        #expect(health.status == 200)
        let ready = try await httpGet(port: server.port, path: "/readyz")
        #expect(ready.status == 200)
        #expect(idle.allSatisfy { $0.isActive })
        for channel in idle { try? await channel.close() }
        await server.stop()
    }

    @Test func aSlowLorisRequestIsClosedAtTheRequestTimeoutAndProbesGoOn() async throws {
        let server = try await Self.start(.init(requestTimeout: .seconds(1)))
        let clock = ContinuousClock()
        // The server's clock starts at its accept, after this.
        let started = clock.now
        let loris = try await Self.connect(server.port)
        // A request head that never ends: a header byte every 100 ms (at most 15 s of them). On
        // a loaded machine the server may close it before the first byte: writes are best effort.
        try? await loris.writeAndFlush(ByteBuffer(string: "GET /healthz HTTP/1.1\r\nX-Slow: "))
        let trickling = Task {
            for _ in 0..<150 where loris.isActive {
                try? await loris.writeAndFlush(ByteBuffer(string: "a"))
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        // A probe on a connection of its own is answered meanwhile. On a loaded machine the
        // probe's own connection can reach the 1 s request timeout before its request is
        // written: it is asked again then, as a kubelet would.
        var probe: (status: Int, body: String)?
        for _ in 0..<3 where probe == nil { probe = try? await httpGet(port: server.port, path: "/healthz") }
        #expect(probe?.status == 200)
        try await loris.closeFuture.get()
        let elapsed = clock.now - started
        trickling.cancel()
        #expect(elapsed >= .seconds(1) && elapsed < .seconds(10), "\(elapsed)")
        // An idle keep-alive connection goes the same way after its answer.
        let idle = try await Self.connect(server.port)
        try await idle.closeFuture.get()
        await server.stop()
    }

    @Test func connectionsPastTheCapAreClosedAsTheyArrive() async throws {
        let server = try await Self.start(.init(requestTimeout: .seconds(120), maxConnections: 10))
        var held: [any Channel] = []
        for _ in 0..<10 { held.append(try await Self.connect(server.port)) }
        // A connect returns once the kernel took it; the server counts it when it accepts it
        // (one run with many tests at once had the eleventh arrive before the tenth counted).
        try await waitUntil { server.openConnections == 10 }
        // The eleventh is accepted by the kernel and closed by the server at once.
        let extra = try await Self.connect(server.port)
        try await extra.closeFuture.get()
        #expect(held.allSatisfy { $0.isActive })
        // Room again once the server saw one go: probes get through.
        try await held.removeLast().close()
        try await waitUntil { server.openConnections == 9 }
        let probe = try await httpGet(port: server.port, path: "/healthz")
        #expect(probe.status == 200)
        for channel in held { try? await channel.close() }
        await server.stop()
    }

    /// Readiness is the relay's own state; its dependencies' trouble shows only on
    /// `/readyz?verbose`, with the same status.
    @Test func dependencyProblemsShowOnVerboseReadinessOnly() async throws {
        struct Degraded: RelayStatus {
            let notReady: String?
            var notAliveReason: String? { nil }
            var notReadyReason: String? { notReady }
            var dependencyProblems: [String] { ["Redis unreachable (not consuming): connection refused", "no ready APNs connection for a"] }
        }
        for notReady in [nil, "stopping"] {
            let server = try await StatusServer.start(host: "127.0.0.1", port: 0, registry: PrometheusCollectorRegistry(),
                                                      status: Degraded(notReady: notReady), limits: .init())
            let status = notReady == nil ? 200 : 503
            let head = notReady.map { "not ready: \($0)\n" } ?? "ready\n"
            for path in ["/readyz", "/readyz?verbose=0", "/readyz?verbose=false", "/readyz?verbosely"] {
                let plain = try await httpGet(port: server.port, path: path)
                #expect(plain.status == status && plain.body == head, "\(path)")
            }
            for path in ["/readyz?verbose", "/readyz?verbose=1", "/readyz?verbose=true", "/readyz?x=1&verbose"] {
                let verbose = try await httpGet(port: server.port, path: path)
                #expect(verbose.status == status)
                #expect(verbose.body == head + "dependency: Redis unreachable (not consuming): connection refused\n"
                        + "dependency: no ready APNs connection for a\n", "\(path)")
            }
            await server.stop()
        }
        let fine = try await Self.start(.init())
        #expect(try await httpGet(port: fine.port, path: "/readyz?verbose").body == "ready\ndependencies: ok\n")
        await fine.stop()
    }
}
