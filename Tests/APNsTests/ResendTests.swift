import APNs
import APNsSimulator
import NIOCore
import TestSupport
import Testing

/// What APNs did not process goes out again, up to the resend cap; what it may have processed
/// does not; a server that never becomes ready fails the connection in time; a stream limit
/// lowered mid-connection is obeyed.
@Suite("Resends, readiness and stream limits", .timeLimit(.minutes(2)))
struct ResendTests {
    static func notification(_ text: String = "hi") -> APNsNotification {
        .alert(text, deviceToken: sampleToken, topic: sampleTopic)
    }

    /// REFUSED_STREAM outside a GOAWAY: not processed, so it goes out again (the client
    /// prefers a connection other than the refusing one).
    /// Awaited or by callback (the relay's way), and either way nothing stays counted after.
    @Test(arguments: [false, true])
    func aRefusedStreamGoesOutAgainOnTheOtherConnection(byCallback: Bool) async throws {
        let harness = try await Harness.start(connections: 2, configure: { $0.behaviour.refuseNext = 1 })
        let result = try await harness.client.send(Self.notification(), byCallback: byCallback)
        #expect(result.classification == .delivered)
        #expect(result.attempts == 2)
        #expect(harness.simulator.disrupted.refused == [result.apnsID])
        #expect(harness.simulator.accepted.map(\.apnsID) == [result.apnsID])
        #expect(harness.client.sendsUnderWay == 0 && harness.client.requestsUnderWay == 0)
        await harness.stop()
    }

    @Test(arguments: [false, true])
    func refusalsEndAtTheResendCap(byCallback: Bool) async throws {
        let harness = try await Harness.start(connections: 2, configure: { $0.behaviour.refuseNext = 100 },
                                              configureClient: { $0.maxResends = 3 })
        let result = try await harness.client.send(Self.notification(), byCallback: byCallback)
        #expect(result.failure == .notSent("REFUSED_STREAM"), "\(String(describing: result.failure))")
        #expect(result.attempts == 4)
        #expect(harness.simulator.disrupted.refused.count == 4)
        #expect(harness.simulator.accepted.isEmpty)
        #expect(harness.client.sendsUnderWay == 0 && harness.client.requestsUnderWay == 0)
        await harness.stop()
    }

    /// The connection closed after the request was written: APNs may have it, so it is not sent
    /// again (the caller decides); the next notification goes out on a new connection.
    @Test func aRequestWhoseConnectionDiedAfterItWentOutIsNotSentAgain() async throws {
        let harness = try await Harness.start(connections: 1, configure: { $0.behaviour.dropConnectionOnNext = 1 })
        let lost = try await harness.client.send(Self.notification("first"))
        guard case .connectionLost? = lost.failure else {
            Issue.record("expected a lost connection, got \(lost)")
            return
        }
        #expect(lost.attempts == 1)
        #expect(harness.simulator.disrupted.dropped == [lost.apnsID])
        let next = try await harness.client.send(Self.notification("second"))
        #expect(next.classification == .delivered && next.attempts == 1)
        #expect(harness.simulator.accepted.map(\.apnsID) == [next.apnsID], "the first was never sent again")
        #expect(harness.simulator.connectionsAccepted == 2)
        await harness.stop()
    }

    /// TLS and the client's preface go through, the server never sends its SETTINGS: the
    /// connection fails at the connect timeout, and the send says why.
    @Test func noSettingsBeforeTheConnectTimeoutFailsTheConnection() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: [])
        var configuration = APNsClientConfiguration(endpoint: APNsEndpoint(host: "127.0.0.1", port: server.port),
                                                    credential: .token(try LocalProviderTokenSource(signer: TestKey().signer)))
        configuration.connections = 1
        configuration.connectTimeout = .milliseconds(300)
        configuration.requestTimeout = .seconds(3)
        configuration.insecureSkipVerify = true
        let client = try APNsClient(configuration: configuration)
        let result = try await client.send(Self.notification())
        let failure = result.failure.map { "\($0)" } ?? "none"
        #expect(failure.contains("not sent") && failure.contains("not ready in time"), "\(failure)")
        await client.shutdown()
        await server.stop()
    }

    /// SETTINGS_MAX_CONCURRENT_STREAMS lowered mid-connection (to 2, then 0, then up again):
    /// the client never opens more, waits while it is 0, and nothing is refused or lost.
    @Test func aStreamLimitLoweredMidConnectionIsObeyed() async throws {
        let harness = try await Harness.start(connections: 1, configure: { $0.behaviour.latency = .milliseconds(20) })
        // The first notification raises the simulator's limit (it starts at 1).
        #expect(try await harness.client.send(Self.notification()).classification == .delivered)
        harness.simulator.setMaxConcurrentStreamsAll(2)
        try await waitUntil { harness.client.streamLimit == 2 }
        let limited = try await Self.burst(harness, 20)
        #expect(limited.allSatisfy { $0.classification == .delivered && $0.attempts == 1 })

        harness.simulator.setMaxConcurrentStreamsAll(0)
        try await waitUntil { harness.client.streamLimit == 0 }
        let waiting = Task { try await Self.burst(harness, 10) }
        // Nothing goes out while the limit is 0 (the sends wait in the client); raised, they
        // all do.
        try await waitUntil { harness.client.sendsUnderWay == 10 }
        #expect(harness.simulator.accepted.count == 21)
        harness.simulator.setMaxConcurrentStreamsAll(5)
        let resumed = try await waiting.value
        #expect(resumed.allSatisfy { $0.classification == .delivered && $0.attempts == 1 })
        #expect(harness.simulator.accepted.count == 31)
        #expect(harness.simulator.connectionsAccepted == 1)
        await harness.stop()
        // The simulator counts a connection's peak and violations when it closes: never more
        // streams than the highest limit since the first (5), no limit broken.
        let report = harness.simulator.streamLimitReport
        #expect(report.peakOverall <= 5 && report.violations == 0, "\(report)")
    }

    static func burst(_ harness: Harness, _ count: Int) async throws -> [APNsResult] {
        try await withThrowingTaskGroup(of: APNsResult.self) { group in
            for index in 0..<count { group.addTask { try await harness.client.send(Self.notification("burst \(index)")) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
    }
}
