import APNs
import HTTP2
import NIOCore
import NIOPosix
import TestSupport
import Testing

/// Bad endpoints give one clear failure naming the cause, within the deadline, and no crash.
@Suite("Bad peers", .timeLimit(.minutes(3)))
struct BadPeerTests {
    /// A one-connection client of a local bad peer (its certificate not checked).
    static func client(of port: Int, timeout: TimeAmount) throws -> APNsClient {
        var configuration = APNsClientConfiguration(
            endpoint: APNsEndpoint(host: "127.0.0.1", port: port),
            credential: .token(try LocalProviderTokenSource(signer: TestKey().signer)))
        configuration.connections = 1
        configuration.requestTimeout = timeout
        configuration.insecureSkipVerify = true
        return try APNsClient(configuration: configuration)
    }

    /// `connectedFirst`: the send waits until the connection is up (the peer's SETTINGS read),
    /// so that `timeout` times the request alone, not a handshake a loaded machine makes slow.
    static func send(to port: Int, timeout: TimeAmount = .seconds(2), connectedFirst: Bool = false) async throws -> (APNsResult, Duration) {
        let client = try client(of: port, timeout: timeout)
        if connectedFirst {
            client.start()
            try await waitUntil(timeout: .seconds(60)) { client.readyConnections == 1 }
        }
        let started = ContinuousClock.now
        let result = try await client.send(.alert("x", deviceToken: sampleToken, topic: sampleTopic))
        let elapsed = ContinuousClock.now - started
        await client.shutdown()
        return (result, elapsed)
    }

    static func failureText(_ result: APNsResult) -> String {
        result.failure.map { "\($0)" } ?? "no failure"
    }

    @Test func unreachableEndpoint() async throws {
        // Bind and close a socket to find a port nobody listens on.
        let probe = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        let port = probe.localAddress!.port!
        try await probe.close()
        let (result, elapsed) = try await Self.send(to: port)
        #expect(result.classification == .retryable)
        #expect(Self.failureText(result).contains("not sent"))
        #expect(Self.failureText(result).lowercased().contains("refused"), "\(Self.failureText(result))")
        #expect(elapsed < .seconds(10))  // generous: the suite loads both cores; the reason above is the proof
    }

    @Test func serverThatIsNotTLS() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: nil, greeting: Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8))
        let (result, elapsed) = try await Self.send(to: server.port)
        #expect(result.classification == .retryable)
        #expect(Self.failureText(result).contains("not sent"), "\(Self.failureText(result))")
        #expect(elapsed < .seconds(10))  // generous: the suite loads both cores; the reason above is the proof
        await server.stop()
    }

    @Test func tlsServerWithoutHTTP2() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["http/1.1"], greeting: [])
        let (result, _) = try await Self.send(to: server.port)
        #expect(Self.failureText(result).contains("ALPN"), "\(Self.failureText(result))")
        await server.stop()
    }

    @Test func serverThatSpeaksGarbageAfterALPN() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: Array("HTTP/1.1 200 OK\r\n\r\n".utf8))
        // The send waits for a connection until its deadline, and its failure names the last
        // connection's error: a deadline long enough for a loaded machine's handshake to reach
        // the garbage (at 2 s the handshake alone could use it up).
        let (result, _) = try await Self.send(to: server.port, timeout: .seconds(8))
        #expect(Self.failureText(result).contains("HTTP/2 protocol error"), "\(Self.failureText(result))")
        await server.stop()
    }

    @Test func peerThatStopsAnsweringHitsTheDeadline() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: ScriptedServer.settingsFrame)
        let (result, elapsed) = try await Self.send(to: server.port, timeout: .milliseconds(700), connectedFirst: true)
        #expect(result.failure == .timedOut(""))
        // The peer would never answer; the 700 ms deadline ends the send (a generous bound: the
        // suite runs many tests at once on two cores).
        #expect(elapsed >= .milliseconds(700) && elapsed < .seconds(10), "\(elapsed)")
        await server.stop()
    }

    /// Review 4.1: the client shut down while its connection waits for the server's first
    /// SETTINGS (TLS done, the client's preface sent, nothing back): the waiting send ends
    /// with a failure, before its deadline, and nothing traps (`scripts/test
    /// --sanitize=address` runs it under the address sanitizer).
    @Test func aShutdownBetweenConnectAndTheServersSettingsEndsCleanly() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: [])
        let client = try Self.client(of: server.port, timeout: .seconds(60))
        let started = ContinuousClock.now
        let sending = Task { try await client.send(.alert("x", deviceToken: sampleToken, topic: sampleTopic)) }
        #expect(await server.heardFromAClient.wait(atMost: .seconds(30)))
        await client.shutdown()
        let result = try await sending.value
        #expect(result.failure != nil, "\(Self.failureText(result))")
        #expect(ContinuousClock.now - started < .seconds(30))
        await server.stop()
    }

    /// Review 4.2: a server that allows no stream at all (SETTINGS_MAX_CONCURRENT_STREAMS 0)
    /// leaves the connection not ready, and requests waiting for a stream end at their deadline
    /// and leave the queue; the queue is bounded.
    @Test func aServerThatAllowsNoStreamIsNotReadyAndWaitingRequestsEnd() async throws {
        let noStreams: [UInt8] = [0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0]
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: noStreams)
        let client = try Self.client(of: server.port, timeout: .milliseconds(500))
        // Connected first (TLS done, the server heard the preface and sends its SETTINGS): the
        // request's 500 ms are spent waiting for a stream, not for a connection a loaded machine
        // (a sanitizer run) is slow to make.
        client.start()
        #expect(await server.heardFromAClient.wait(atMost: .seconds(30)))
        let result = try await client.send(.alert("x", deviceToken: sampleToken, topic: sampleTopic))
        #expect(result.failure == .timedOut(""), "\(Self.failureText(result))")
        #expect(client.readyConnections == 0)
        await client.shutdown()

        var h2 = HTTP2ClientHandler.Configuration()
        h2.maxPendingRequests = 3
        h2.timerResolution = .milliseconds(10)
        let raw = try await RawHTTP2Client.connect(port: server.port, configuration: h2)
        let request = HTTP2Request(authority: "127.0.0.1", path: "/3/device/\(sampleToken)")
        let answers = await withTaskGroup(of: Result<HTTP2Response, HTTP2StreamError>.self) { group in
            for _ in 0..<5 { group.addTask { await raw.result(request, timeout: .milliseconds(300)) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.filter { if case .failure(.timedOut) = $0 { return true }; return false }.count == 3)
        #expect(answers.filter { if case .failure(.refused) = $0 { return true }; return false }.count == 2)
        #expect(await raw.pendingRequests() == 0)
        await raw.close()
        await server.stop()
    }

    @Test func unansweredPingClosesTheConnection() async throws {
        let server = try await ScriptedServer.start(tlsProtocols: ["h2"], greeting: ScriptedServer.settingsFrame)
        var configuration = HTTP2ClientHandler.Configuration()
        configuration.idlePingInterval = .milliseconds(200)
        configuration.pingTimeout = .milliseconds(300)
        let raw = try await RawHTTP2Client.connect(port: server.port, configuration: configuration)
        let error = try await raw.closed()
        #expect(error == .pingTimeout)
        await server.stop()
    }
}
