public import Common
import Foundation
import HTTP2
public import Logging
public import NIOCore
import NIOPosix
public import NIOSSL
public import ServiceLifecycle
import Synchronization

public struct APNsClientConfiguration: Sendable {
    public var endpoint: APNsEndpoint
    public var credential: APNsCredential
    /// Connections in the pool.
    public var connections: Int = 2
    /// Deadline for one send, from the call to the answer, queueing and resends included.
    public var requestTimeout: TimeAmount = .seconds(10)
    public var connectTimeout: TimeAmount = .seconds(10)
    /// Sends that may wait for a free stream across the pool; one more is refused with
    /// ``APNsError/queueFull(limit:)``.
    public var maxQueuedNotifications: Int = 10_000
    /// Names the client's credential in `apns_relay_apns_connections_ready{credential}` (the
    /// relay: `TEAM:KEY` for a token, a certificate's subject).
    public var credentialLabel = "default"
    /// Our own cap on streams per connection, whatever APNs allows.
    public var maxStreamsPerConnection: Int = 1000
    public var idlePingInterval: TimeAmount = .seconds(60)
    public var pingTimeout: TimeAmount = .seconds(10)
    public var reconnectBackoff = Backoff(base: .milliseconds(250), maximum: .seconds(30))
    /// How often a request APNs did not process (GOAWAY, REFUSED_STREAM) is sent again.
    public var maxResends: Int = 5
    /// Skip TLS certificate verification (simulators with self-signed certificates only).
    public var insecureSkipVerify: Bool = false
    /// Extra trust roots besides the system's (a simulator's certificate, say).
    public var additionalTrustRoots: [NIOSSLCertificate] = []
    /// An HTTP proxy the connections tunnel through (`CONNECT`), unless its `noProxy` names
    /// the endpoint's host.
    public var proxy: APNsProxy?

    public init(endpoint: APNsEndpoint, credential: APNsCredential) {
        self.endpoint = endpoint
        self.credential = credential
    }
}

/// Sends notifications to APNs over a pool of HTTP/2 connections.
///
/// Safe to call from many tasks at once. Each `send` validates the notification, waits (bounded)
/// for a free stream, and returns APNs' answer classified; a request APNs did not process
/// (streams above a GOAWAY's last-stream-id, REFUSED_STREAM) goes out again on another
/// connection, and an ExpiredProviderToken answer gets one fresh token and one retry.
///
/// The initialiser opens nothing: the connections start with ``start()``, ``run()`` or the
/// first send. As a `Service`, the client closes its connections gracefully when its service
/// group shuts down.
public final class APNsClient: Service, Sendable {
    public let configuration: APNsClientConfiguration
    private let connections: [APNsConnection]
    /// One executor per event loop the pool's connections live on.
    public let taskExecutors: [EventLoopTaskExecutor]
    private let group: any EventLoopGroup
    private let ownsGroup: Bool
    private let next = Atomic<Int>(0)
    private let isShutDown = Atomic<Bool>(false)
    private let shutDownLatch = AsyncLatch()
    private let started = Atomic<Bool>(false)
    /// Sends between admission and answer; bounded by the streams the pool may open plus
    /// `maxQueuedNotifications`.
    private let outstanding = Atomic<Int>(0)
    private let logger: Logger

    public init(configuration: APNsClientConfiguration, eventLoopGroup: (any EventLoopGroup)? = nil,
                logger: Logger = Logger(label: "apns-relay.apns")) throws(APNsError) {
        guard configuration.connections >= 1 else { throw .credential("connections must be at least 1") }
        self.configuration = configuration
        self.logger = logger
        if let eventLoopGroup {
            self.group = eventLoopGroup
            self.ownsGroup = false
        } else {
            self.group = MultiThreadedEventLoopGroup(numberOfThreads: min(configuration.connections, System.coreCount))
            self.ownsGroup = true
        }
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["h2"]
        if configuration.insecureSkipVerify {
            tls.certificateVerification = .none
        }
        if !configuration.additionalTrustRoots.isEmpty {
            tls.additionalTrustRoots = [.certificates(configuration.additionalTrustRoots)]
        }
        if case .certificate(let chain, let key) = configuration.credential {
            tls.certificateChain = chain.map { .certificate($0) }
            tls.privateKey = .privateKey(key)
        }
        let sslContext: NIOSSLContext
        do {
            sslContext = try NIOSSLContext(configuration: tls)
        } catch {
            throw .credential("cannot set up TLS: \(error)")
        }
        // Its own group: connection i on loop i. A shared group: each connection on the loop
        // the group hands out next, so the connections of several clients spread over its loops.
        let group = self.group, shared = !ownsGroup
        let loops = shared ? (0..<configuration.connections).map { _ in group.next() } : Array(group.makeIterator())
        let ready = APNsMetrics.ready(credential: configuration.credentialLabel)
        ready.increment(by: 0)
        APNsMetrics.registerConnections()
        self.connections = (0..<configuration.connections).map { index in
            APNsConnection(index: index, eventLoop: loops[index % loops.count], endpoint: configuration.endpoint,
                           sslContext: sslContext, configuration: configuration, ready: ready, logger: logger)
        }
        self.taskExecutors = loops.prefix(configuration.connections).map { EventLoopTaskExecutor(eventLoop: $0) }
    }

    /// Starts connecting every connection of the pool, once.
    public func start() {
        guard !started.load(ordering: .relaxed), !started.exchange(true, ordering: .relaxed) else { return }
        for connection in connections { connection.start() }
    }

    /// Connects, waits for a graceful shutdown of the service group (or cancellation, or a
    /// direct ``shutdown()``), then shuts the client down.
    public func run() async {
        start()
        await waitForGracefulShutdown(orUntil: shutDownLatch)
        await shutdown()
    }

    /// Sends one notification and returns APNs' answer (or why none came).
    ///
    /// Throws ``APNsError/invalidNotification(_:)`` without sending anything when local
    /// validation fails, ``APNsError/queueFull(limit:)`` when too many sends wait for a stream,
    /// and ``APNsError/shutdown`` after ``shutdown()``. A cancelled task stops waiting at once
    /// and throws `CancellationError` (its request may still reach APNs if it was on the wire).
    public func send(_ notification: APNsNotification) async throws -> APNsResult {
        // The synchronous work lives in helpers that are never inlined here: every byte of this
        // function's locals sits in the async frame of each send in flight, so it stays small.
        start()
        try admit(notification)
        defer { outstanding.subtract(1, ordering: .relaxed) }
        let attempt = makeAttempt(notification)
        if case .token(let source) = configuration.credential {
            attempt.use(try await source.currentToken())
        }
        while true {
            let connection = pickConnection(avoiding: attempt.avoid)
            let answer = await connection.execute(attempt.request, deadline: attempt.deadline)
            if case .failure = answer { try Task.checkCancellation() }
            switch judge(answer, from: connection, attempt) {
            case .finished(let result):
                return result
            case .resend:
                continue
            case .refreshToken(let source, let rejected):
                attempt.use(try await source.refresh(after: rejected))
            }
        }
    }

    /// Sends one notification without a task: `completion` hears what ``send(_:)`` would return
    /// or throw, on the event loop of the connection that answered (at once, on the caller's
    /// thread, when the notification is refused before it is sent). Nothing cancels it but the
    /// request timeout. The provider token comes from the source's copy when it is fresh
    /// (``ProviderTokenSource/freshToken()``); only a token to fetch or refresh takes a task.
    public func send(_ notification: APNsNotification, completion: @escaping @Sendable (Result<APNsResult, any Error>) -> Void) {
        start()
        do {
            try admit(notification)
        } catch {
            return completion(.failure(error))
        }
        let attempt = makeAttempt(notification)
        attempt.completion = completion
        guard case .token(let source) = configuration.credential else { return sendAttempt(attempt) }
        if let token = source.freshToken() {
            attempt.use(token)
            return sendAttempt(attempt)
        }
        Task {
            do {
                attempt.use(try await source.currentToken())
            } catch {
                return self.finish(attempt, .failure(error))
            }
            self.sendAttempt(attempt)
        }
    }

    /// One attempt of a callback send. The connection's `load` counts it until its answer
    /// (counted here, not by the connection, so that the request carries one closure, and that
    /// closure holds only the attempt: no allocation for its captures).
    private func sendAttempt(_ attempt: Attempt) {
        let connection = pickConnection(avoiding: attempt.avoid)
        attempt.connection = connection
        connection.load.add(1, ordering: .relaxed)
        connection.execute(attempt.request, deadline: attempt.deadline) { [attempt] answer in
            attempt.client.answered(attempt, answer)
        }
    }

    /// A callback send's attempt was answered: the caller hears the result, or the next attempt
    /// its answer calls for goes.
    private func answered(_ attempt: Attempt, _ answer: Result<HTTP2Response, HTTP2StreamError>) {
        guard let connection = attempt.connection else {
            preconditionFailure("an attempt is answered only once it went to a connection")
        }
        connection.load.subtract(1, ordering: .relaxed)
        switch judge(answer, from: connection, attempt) {
        case .finished(let result):
            finish(attempt, .success(result))
        case .resend:
            sendAttempt(attempt)
        case .refreshToken(let source, let rejected):
            Task {
                do {
                    attempt.use(try await source.refresh(after: rejected))
                } catch {
                    return self.finish(attempt, .failure(error))
                }
                self.sendAttempt(attempt)
            }
        }
    }

    /// A callback send ends: it no longer counts among the client's sends, and its caller hears.
    private func finish(_ attempt: Attempt, _ result: Result<APNsResult, any Error>) {
        outstanding.subtract(1, ordering: .relaxed)
        attempt.completion?(result)
    }

    /// An answer to ``request(method:path:headers:body:)``.
    public struct Answer: Sendable {
        public var status: Int
        public var headers: [(name: String, value: String)]
        public var body: [UInt8]

        public subscript(header name: String) -> String? { headers.first { $0.name == name }?.value }
    }

    /// Sends one request other than a push (channel management: `GET /1/apps/…`) on the
    /// client's connections, with the provider token when the credential is a token, and
    /// returns the answer, whatever its status. Throws ``APNsError/noAnswer(_:)`` when none came
    /// within the request timeout, ``APNsError/shutdown`` after ``shutdown()``.
    public func request(method: String, path: String, headers: [(String, String)] = [], body: [UInt8]? = nil) async throws -> Answer {
        guard !isShutDown.load(ordering: .relaxed) else { throw APNsError.shutdown }
        start()
        var fields = HTTP2Headers(headers.map { (name: $0.0, value: $0.1) })
        if case .token(let source) = configuration.credential {
            fields.add("authorization", try await source.currentToken().authorization)
        }
        let request = HTTP2Request(method: method, scheme: "https", authority: configuration.endpoint.host, path: path,
                                   headers: fields, body: body.map { ByteBuffer(bytes: $0) })
        switch await pickConnection(avoiding: nil).execute(request, deadline: .now() + configuration.requestTimeout) {
        case .success(let response):
            return Answer(status: response.status, headers: response.headers.fields.map { ($0.name, $0.value) },
                          body: response.body.map { Array($0.readableBytesView) } ?? [])
        case .failure(let error):
            throw APNsError.noAnswer(error.description)
        }
    }

    /// Closes every connection gracefully: in-flight requests finish, waiting ones fail.
    /// Requests still open `grace` after the call (10 s unless told) are cut: their sends end
    /// with a lost connection. Later calls wait for the first one to finish.
    public func shutdown(grace: Duration = .seconds(10)) async {
        guard !isShutDown.exchange(true, ordering: .relaxed) else {
            await shutDownLatch.wait()
            return
        }
        // All at once: each connection's grace runs from now.
        await withTaskGroup(of: Void.self) { group in
            for connection in connections {
                group.addTask { try? await connection.shutdown(grace: TimeAmount(grace)).get() }
            }
        }
        if ownsGroup {
            try? await group.shutdownGracefully()
        }
        shutDownLatch.open()
    }

    /// Connections that have a ready HTTP/2 channel now.
    public var readyConnections: Int {
        connections.reduce(0) { $0 + ($1.isReady.load(ordering: .relaxed) ? 1 : 0) }
    }

    /// Streams the ready connections may have open at once (each server's
    /// SETTINGS_MAX_CONCURRENT_STREAMS, capped by ours).
    public var streamLimit: Int {
        connections.reduce(0) { $0 + $1.streamLimit.load(ordering: .relaxed) }
    }

    /// Sends admitted and not yet answered (waiting for a stream, or on the wire).
    public var sendsUnderWay: Int { outstanding.load(ordering: .relaxed) }

    /// Requests handed to the connections and not answered yet (every attempt counts while it
    /// is out): what picks the least loaded connection.
    package var requestsUnderWay: Int { connections.reduce(0) { $0 + $1.load.load(ordering: .relaxed) } }

    /// Connections the pool has tried to open so far (reconnects included).
    public var connectAttempts: Int {
        connections.reduce(0) { $0 + $1.connectAttempts.load(ordering: .relaxed) }
    }

    // MARK: Internals

    /// Validates a notification and counts it in, or refuses it when every stream is busy and
    /// the wait queue is full.
    @inline(never)
    private func admit(_ notification: APNsNotification) throws(APNsError) {
        // One already checked (``APNsNotification/validated()``, unchanged since) is not checked again.
        if !notification.isValidated {
            do {
                try notification.validate()
            } catch {
                throw .invalidNotification(error)
            }
        }
        guard !isShutDown.load(ordering: .relaxed) else { throw .shutdown }
        let streams = connections.reduce(0) { $0 + $1.streamLimit.load(ordering: .relaxed) }
        let capacity = streams + configuration.maxQueuedNotifications
        var current = outstanding.load(ordering: .relaxed)
        while true {
            guard current < capacity else { throw .queueFull(limit: configuration.maxQueuedNotifications) }
            let (exchanged, original) = outstanding.compareExchange(
                expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }

    /// One send's state across its attempts. A class, so the async frame of each send in
    /// flight holds one reference instead of the request. `@unchecked Sendable`: one send
    /// touches it at a time (a callback send's steps run one after another).
    private final class Attempt: @unchecked Sendable {
        var request: HTTP2Request
        let apnsID: String
        let deadline: NIODeadline
        var token: ProviderToken?
        var count = 0
        var refreshedToken = false
        /// The connection that refused the last attempt.
        var avoid: Int?
        /// The client sending it (a callback send's answer finds its way back through it).
        let client: APNsClient
        /// A callback send's: who hears its result (nil for an awaited send).
        var completion: (@Sendable (Result<APNsResult, any Error>) -> Void)?
        /// A callback send's: the connection its current attempt went to.
        var connection: APNsConnection?

        init(request: HTTP2Request, apnsID: String, deadline: NIODeadline, client: APNsClient) {
            self.request = request
            self.apnsID = apnsID
            self.deadline = deadline
            self.client = client
        }

        /// Sends `fresh` as the `authorization` header from now on.
        func use(_ fresh: ProviderToken) {
            token = fresh
            if let index = request.headers.fields.firstIndex(where: { $0.name == "authorization" }) {
                request.headers.fields[index].value = fresh.authorization
            } else {
                request.headers.add("authorization", fresh.authorization)
            }
        }
    }

    private enum Verdict {
        case finished(APNsResult)
        case resend
        case refreshToken(any ProviderTokenSource, rejected: ProviderToken)
    }

    @inline(never)
    private func makeAttempt(_ notification: APNsNotification) -> Attempt {
        let apnsID = APNsIdentifiers.format(notification.apnsID)
        return Attempt(request: makeRequest(notification, apnsID: apnsID), apnsID: apnsID,
                       deadline: .now() + configuration.requestTimeout, client: self)
    }

    /// What to do after one attempt: answer the caller, send again elsewhere, or retry once with
    /// a fresh token after ExpiredProviderToken.
    @inline(never)
    private func judge(_ answer: Result<HTTP2Response, HTTP2StreamError>, from connection: APNsConnection,
                       _ attempt: Attempt) -> Verdict {
        attempt.count += 1
        let apnsID = attempt.apnsID
        let attempts = attempt.count
        switch answer {
        case .success(let response):
            let result = Self.result(from: response, apnsID: apnsID, attempts: attempts)
            if result.reason == .expiredProviderToken, !attempt.refreshedToken,
               case .token(let source) = configuration.credential, let rejected = attempt.token {
                attempt.refreshedToken = true
                return .refreshToken(source, rejected: rejected)
            }
            return .finished(result)
        case .failure(.refused(let why)):
            if attempts > configuration.maxResends || NIODeadline.now() >= attempt.deadline || isShutDown.load(ordering: .relaxed) {
                return .finished(APNsResult(failure: .notSent(why), apnsID: apnsID, attempts: attempts))
            }
            attempt.avoid = connection.index
            return .resend
        case .failure(.connectionLost(let why)):
            return .finished(APNsResult(failure: .connectionLost(why), apnsID: apnsID, attempts: attempts))
        case .failure(.timedOut):
            return .finished(APNsResult(failure: .timedOut(""), apnsID: apnsID, attempts: attempts))
        case .failure(.reset(let code)):
            return .finished(APNsResult(failure: .streamReset(code), apnsID: apnsID, attempts: attempts))
        case .failure(let error):
            return .finished(APNsResult(failure: .invalidResponse(error.description), apnsID: apnsID, attempts: attempts))
        }
    }

    /// The least-loaded ready connection (round robin among equals), preferring those on the
    /// caller's own event loop; any connection when none is ready, so the send waits for a
    /// reconnect instead of failing at once.
    private func pickConnection(avoiding avoided: Int?) -> APNsConnection {
        let start = next.wrappingAdd(1, ordering: .relaxed).oldValue
        var best: APNsConnection?
        var bestScore = Int.max
        for offset in 0..<connections.count {
            let connection = connections[(start &+ offset) % connections.count]
            var score = connection.load.load(ordering: .relaxed)
            if !connection.isReady.load(ordering: .relaxed) { score += 1 << 40 }
            if !connection.eventLoop.inEventLoop { score += 1 << 20 }
            if connection.index == avoided, connections.count > 1 { score += 1 << 41 }
            if score < bestScore {
                best = connection
                bestScore = score
            }
        }
        return best!
    }

    /// The request without its `authorization` header (``Attempt/use(_:)`` adds it).
    private func makeRequest(_ notification: APNsNotification, apnsID: String) -> HTTP2Request {
        Self.request(for: notification, apnsID: apnsID, authority: configuration.endpoint.host)
    }
}
