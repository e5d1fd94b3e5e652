import Common
import HTTP2
import Logging
import Metrics
import NIOCore
import NIOExtras
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One of the pool's connections to APNs, kept open for as long as APNs lets it live.
///
/// The slot owns at most one live HTTP/2 channel at a time (plus channels draining after a
/// GOAWAY), reconnects with exponential backoff and jitter whenever its channel closes, and holds
/// the requests that arrive while it is not connected until a channel is ready or their deadline
/// passes.
///
/// `@unchecked Sendable`: every mutable stored property is touched only on `eventLoop` (the
/// methods that touch it assert so in debug builds, which the tests use); the atomics are what
/// other threads read.
final class APNsConnection: @unchecked Sendable {
    typealias Completion = (Result<HTTP2Response, HTTP2StreamError>) -> Void
    typealias SendableCompletion = @Sendable (Result<HTTP2Response, HTTP2StreamError>) -> Void

    private enum State {
        case idle
        case connecting(generation: Int)
        case ready(generation: Int, handler: HTTP2ClientHandler, since: NIODeadline)
        case backingOff(Scheduled<Void>)
        case shutDown
    }

    private struct Submission {
        var request: HTTP2Request
        var deadline: NIODeadline
        /// A waiting task's (``execute(_:deadline:)``), or nil for a callback's.
        var answer: PendingAnswer?
        var completion: SendableCompletion
    }

    private struct Inbox {
        var submissions: [Submission] = []
        var drainScheduled = false
    }

    private struct Waiting {
        var request: HTTP2Request
        var deadline: NIODeadline
        var completion: Completion
    }

    let eventLoop: any EventLoop
    let index: Int
    /// `apns_relay_apns_connections_ready{credential}` of the client's credential.
    private let readyMeter: Meter
    private let endpoint: APNsEndpoint
    private let sslContext: NIOSSLContext
    private let configuration: APNsClientConfiguration
    private let logger: Logger

    // Event-loop confined.
    // Stored state below is `@exclusivity(unchecked)`: only this connection's event loop
    // touches it, so accesses never overlap, and the dynamic exclusivity checks cost about 9% of
    // the client's throughput (bench apns, see docs/architecture.md).
    @exclusivity(unchecked) private var state: State = .idle
    @exclusivity(unchecked) private var generation = 0
    @exclusivity(unchecked) private var failures = 0
    @exclusivity(unchecked) private var lastError: String?
    @exclusivity(unchecked) private var waiting = CircularBuffer<Waiting>()
    @exclusivity(unchecked) private var waitingTimer: Scheduled<Void>?
    @exclusivity(unchecked) private var channels: [Int: any Channel] = [:]

    /// Arrays reused by `drainInbox` (event loop only).
    @exclusivity(unchecked) private var draining: [Submission] = []
    @exclusivity(unchecked) private var spareSubmissions: [Submission] = []

    // Shared with any thread.
    private let inbox = Locked(Inbox())
    /// Requests handed to this slot and not yet answered (a callback request is counted by its
    /// caller, ``execute(_:deadline:completion:)``).
    let load = Atomic<Int>(0)
    let isReady = Atomic<Bool>(false)
    /// How many streams the ready channel may have open (0 while not ready).
    let streamLimit = Atomic<Int>(0)
    /// Connections this slot has tried to open.
    let connectAttempts = Atomic<Int>(0)

    init(index: Int, eventLoop: any EventLoop, endpoint: APNsEndpoint, sslContext: NIOSSLContext,
         configuration: APNsClientConfiguration, ready: Meter, logger: Logger) {
        self.index = index
        self.readyMeter = ready
        self.eventLoop = eventLoop
        self.endpoint = endpoint
        self.sslContext = sslContext
        self.configuration = configuration
        var logger = logger
        logger[metadataKey: "apns.connection"] = "\(index)"
        self.logger = logger
    }

    /// Records whether the slot has a ready channel (and keeps the ready-connections meter true).
    private func setReady(_ ready: Bool) {
        eventLoop.assertInEventLoop()
        if isReady.exchange(ready, ordering: .relaxed) != ready {
            if ready { readyMeter.increment() } else { readyMeter.decrement() }
        }
    }

    /// Starts the first connection.
    func start() {
        eventLoop.execute { self.connectIfIdle() }
    }

    /// Sends `request`; the answer comes back on this slot's event loop.
    ///
    /// Requests reach the event loop through `inbox`: callers append under a lock and only the
    /// first of a burst schedules a drain, so a busy pool pays one event-loop hop per batch rather
    /// than per notification.
    ///
    /// A cancelled task stops waiting at once with ``PendingAnswer/cancelled``; its request, if
    /// it was already handed over, runs to its answer or deadline on the connection (the answer
    /// is dropped).
    func execute(_ request: HTTP2Request, deadline: NIODeadline) async -> Result<HTTP2Response, HTTP2StreamError> {
        load.add(1, ordering: .relaxed)
        defer { load.subtract(1, ordering: .relaxed) }
        let answer = PendingAnswer()
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                guard answer.install(continuation) else { return }
                submit(request, deadline: deadline, answer: answer)
            }
        } onCancel: {
            answer.cancel()
        }
    }

    /// Sends one request and hands its answer to `completion` (on the connection's event loop,
    /// or at once on the caller's thread when the connection refuses it): no task waits, and
    /// nothing cancels it but its deadline. Unlike the awaited ``execute(_:deadline:)``, it
    /// leaves ``load`` to the caller (``APNsClient`` counts it: a wrapping closure here would
    /// be an allocation per request).
    func execute(_ request: HTTP2Request, deadline: NIODeadline, completion: @escaping SendableCompletion) {
        submit(request, deadline: deadline, answer: nil, completion: completion)
    }

    private func submit(_ request: HTTP2Request, deadline: NIODeadline, answer: PendingAnswer) {
        submit(request, deadline: deadline, answer: answer) { answer.resume($0) }
    }

    private func submit(_ request: HTTP2Request, deadline: NIODeadline, answer: PendingAnswer?, completion: @escaping SendableCompletion) {
        if eventLoop.inEventLoop {
            executeOnLoop(request, deadline: deadline, completion: completion)
            return
        }
        let submission = Submission(request: request, deadline: deadline, answer: answer, completion: completion)
        let scheduleDrain = inbox.withLock { inbox in
            inbox.submissions.append(submission)
            defer { inbox.drainScheduled = true }
            return !inbox.drainScheduled
        }
        if scheduleDrain {
            eventLoop.execute { self.drainInbox() }
        }
    }

    private func drainInbox() {
        eventLoop.assertInEventLoop()
        swap(&draining, &spareSubmissions)
        inbox.withLock { inbox in
            swap(&inbox.submissions, &draining)
            inbox.drainScheduled = false
        }
        for submission in draining {
            // Its task was cancelled before it left the inbox: not sent at all.
            if submission.answer?.isDone ?? false { continue }
            executeOnLoop(submission.request, deadline: submission.deadline, completion: submission.completion)
        }
        draining.removeAll(keepingCapacity: true)
        swap(&draining, &spareSubmissions)
    }

    /// Closes every channel gracefully and fails what waits; channels whose requests are still
    /// open after `grace` are closed at once (those requests end as lost).
    func shutdown(grace: TimeAmount) -> EventLoopFuture<Void> {
        eventLoop.submit {
            if case .backingOff(let scheduled) = self.state { scheduled.cancel() }
            if case .ready(_, let handler, _) = self.state { handler.shutdown() }
            self.state = .shutDown
            self.setReady(false)
            self.streamLimit.store(0, ordering: .relaxed)
            self.failWaiting(.refused("client shut down"))
            let channels = Array(self.channels.values)
            if !channels.isEmpty {
                self.eventLoop.scheduleTask(in: grace) {
                    for channel in channels { channel.close(promise: nil) }
                }
            }
            return channels
        }.flatMap { channels in
            let closed = channels.map { channel in
                channel.closeFuture
            }
            return EventLoopFuture.andAllComplete(closed, on: self.eventLoop)
        }
    }

    // MARK: Event loop

    private func executeOnLoop(_ request: HTTP2Request, deadline: NIODeadline, completion: @escaping Completion) {
        eventLoop.assertInEventLoop()
        switch state {
        case .ready(_, let handler, _) where handler.isAcceptingRequests:
            handler.execute(request, deadline: deadline, completion: completion)
        case .shutDown:
            completion(.failure(.refused("client shut down")))
        default:
            waiting.append(Waiting(request: request, deadline: deadline, completion: completion))
            scheduleWaitingTimer()
            connectIfIdle()
        }
    }

    private func connectIfIdle() {
        eventLoop.assertInEventLoop()
        guard case .idle = state else { return }
        generation += 1
        connectAttempts.add(1, ordering: .relaxed)
        APNsMetrics.attempts.increment()
        let generation = generation
        state = .connecting(generation: generation)
        let host = endpoint.host
        let sslContext = sslContext
        var h2Configuration = HTTP2ClientHandler.Configuration()
        h2Configuration.maxConcurrentStreams = configuration.maxStreamsPerConnection
        h2Configuration.idlePingInterval = configuration.idlePingInterval
        h2Configuration.pingTimeout = configuration.pingTimeout
        h2Configuration.readyTimeout = configuration.connectTimeout
        // The client bounds what it admits; a connection may hold all of it waiting for streams.
        h2Configuration.maxPendingRequests = max(configuration.maxQueuedNotifications, 1)
        let h2 = h2Configuration
        let serverHostname = TLSServerName.of(host: host)
        let proxy = configuration.proxy.flatMap { $0.isUsed(for: host) ? $0 : nil }
        let connectTimeout = configuration.connectTimeout
        let deadline = NIODeadline.now() + connectTimeout
        /// TLS (ALPN h2) and HTTP/2 on the connection (or inside the proxy's tunnel: then the
        /// server's SETTINGS are due by what is left of the connect timeout).
        @Sendable func secure(_ channel: any Channel) throws {
            let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: serverHostname)
            var h2 = h2
            if proxy != nil { h2.readyTimeout = max(deadline - .now(), .milliseconds(1)) }
            let handler = HTTP2ClientHandler(configuration: h2)
            handler.onEvent = { [self] event in self.handle(event, handler: handler, generation: generation) }
            try channel.pipeline.syncOperations.addHandlers([tls, handler])
        }

        ClientBootstrap(group: eventLoop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { [self] channel in
                do {
                    if let proxy {
                        try openTunnel(channel, through: proxy, deadline: deadline, generation: generation, then: secure)
                    } else {
                        try secure(channel)
                    }
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
            .connect(host: proxy?.host ?? host, port: proxy?.port ?? endpoint.port)
            .whenComplete { [self] result in
                switch result {
                case .success(let channel):
                    channels[generation] = channel
                    channel.closeFuture.whenComplete { [self] _ in
                        channels[generation] = nil
                        // A channel that closes before its handler reported anything (TLS failure).
                        if case .connecting(let current) = state, current == generation {
                            connectFailed(lastError ?? "connection closed during the TLS handshake")
                        }
                    }
                case .failure(let error):
                    if case .connecting(let current) = state, current == generation {
                        if let proxy {
                            APNsMetrics.proxyFailures.increment()
                            connectFailed("proxy \(proxy): \(Self.describe(error))")
                        } else {
                            connectFailed(Self.describe(error))
                        }
                    }
                }
            }
    }

    /// Starts the channel as an HTTP `CONNECT` to the APNs host through `proxy` (with
    /// `Proxy-Authorization` when it has credentials); once the proxy answers 2xx, the HTTP/1
    /// handlers go and `secure` adds TLS and HTTP/2 inside the tunnel. Any other answer (or none
    /// by `deadline`) closes the channel with the proxy's answer as the connection's error: a
    /// connection failure like any other, counted in `apns_relay_apns_proxy_failures_total` and retried
    /// with backoff.
    private func openTunnel(_ channel: any Channel, through proxy: APNsProxy, deadline: NIODeadline, generation: Int,
                            then secure: @escaping @Sendable (any Channel) throws -> Void) throws {
        // The authority form: an IPv6 host in brackets.
        let target = endpoint.host.contains(":") ? "[\(endpoint.host)]" : endpoint.host
        var headers = HTTPHeaders([("Host", "\(target):\(endpoint.port)")])
        if let authorization = proxy.authorization { headers.add(name: "Proxy-Authorization", value: authorization) }
        let tunnel = channel.eventLoop.makePromise(of: Void.self)
        let pipeline = channel.pipeline.syncOperations
        try pipeline.addHandler(HTTPRequestEncoder(), name: "proxy-request-encoder")
        try pipeline.addHandler(ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes)),
                                name: "proxy-response-decoder")
        try pipeline.addHandler(NIOHTTP1ProxyConnectHandler(targetHost: target, targetPort: endpoint.port, headers: headers,
                                                            deadline: deadline, promise: tunnel))
        // The proxy's handler removes itself; its HTTP/1 codec goes too (the decoder once it is
        // done with the answer it is reading), then TLS starts inside the tunnel.
        tunnel.futureResult.flatMap {
            channel.pipeline.removeHandler(name: "proxy-response-decoder")
        }.flatMap {
            channel.pipeline.removeHandler(name: "proxy-request-encoder")
        }.flatMapThrowing {
            try secure(channel)
        }.whenFailure { [self] error in
            // Reported before the channel's close, which ends the attempt with it. Only the
            // proxy's own failures count as such (not TLS or HTTP/2 set-up inside the tunnel).
            if case .connecting(let current) = state, current == generation {
                if let failure = error as? NIOHTTP1ProxyConnectHandler.Error {
                    lastError = "proxy \(proxy): \(APNsProxy.describe(failure))"
                    APNsMetrics.proxyFailures.increment()
                } else {
                    lastError = "inside the tunnel of proxy \(proxy): \(Self.describe(error))"
                }
            }
            channel.close(promise: nil)
        }
    }

    private func handle(_ event: HTTP2ClientHandler.Event, handler: HTTP2ClientHandler, generation: Int) {
        eventLoop.assertInEventLoop()
        switch event {
        case .ready:
            guard case .connecting(let current) = state, current == generation else {
                handler.shutdown()
                return
            }
            state = .ready(generation: generation, handler: handler, since: .now())
            // A connection that may open no stream (MAX_CONCURRENT_STREAMS 0) is not ready.
            setReady(handler.streamLimit > 0)
            streamLimit.store(handler.streamLimit, ordering: .relaxed)
            lastError = nil
            logger.debug("connected to APNs", metadata: ["apns.endpoint": "\(endpoint)"])
            let queued = waiting
            waiting.removeAll()
            for item in queued {
                executeOnLoop(item.request, deadline: item.deadline, completion: item.completion)
            }
        case .streamLimitChanged(let limit):
            if case .ready(let current, _, _) = state, current == generation {
                streamLimit.store(limit, ordering: .relaxed)
                setReady(limit > 0)
            }
            logger.debug("APNs changed the stream limit", metadata: ["apns.max_concurrent_streams": "\(limit)"])
        case .goAway(let lastStreamID, let errorCode, let debugData):
            APNsMetrics.goAway(reason: Self.goAwayReason(debugData))
            logger.warning("APNs sent GOAWAY", metadata: [
                "apns.goaway.reason": "\(Self.goAwayReason(debugData))",
                "apns.goaway.last_stream_id": "\(lastStreamID)",
                "apns.goaway.error_code": "\(errorCode)",
            ])
            // The old channel drains on its own; the slot moves on to a new one.
            if case .ready(let current, _, let since) = state, current == generation {
                replaceConnection(readySince: since, why: "GOAWAY \(Self.goAwayReason(debugData))")
            }
        case .closed(let error):
            if let error {
                lastError = error.description
            }
            switch state {
            case .ready(let current, _, let since) where current == generation:
                logger.info("APNs connection closed", metadata: ["apns.error": "\(error?.description ?? "none")"])
                replaceConnection(readySince: since, why: error?.description ?? "closed")
            case .connecting(let current) where current == generation:
                connectFailed(error?.description ?? "connection closed before HTTP/2 was ready")
            default:
                break
            }
        }
    }

    /// The ready channel is gone or going: count a failure if it died young, then reconnect after
    /// a backoff, so that a server that keeps closing connections never sees a tight loop.
    private func replaceConnection(readySince: NIODeadline, why: String) {
        eventLoop.assertInEventLoop()
        setReady(false)
        streamLimit.store(0, ordering: .relaxed)
        let livedLong = NIODeadline.now() - readySince > .seconds(30)
        failures = livedLong ? 0 : failures + 1
        backOff(why)
    }

    private func connectFailed(_ why: String) {
        eventLoop.assertInEventLoop()
        setReady(false)
        failures += 1
        lastError = why
        // Once per change of state: the first failure is a warning, repeats are debug.
        logger.log(level: failures == 1 ? .warning : .debug, "cannot connect to APNs",
                   metadata: ["apns.endpoint": "\(endpoint)", "apns.error": "\(why)", "apns.failures": "\(failures)"])
        backOff(why)
    }

    private func backOff(_ why: String) {
        eventLoop.assertInEventLoop()
        if case .shutDown = state { return }
        let delay = configuration.reconnectBackoff.delay(attempt: max(failures - 1, 0))
        let scheduled = eventLoop.scheduleTask(in: .nanoseconds(delay.totalNanoseconds)) { [self] in
            if case .backingOff = state {
                state = .idle
                connectIfIdle()
            }
        }
        state = .backingOff(scheduled)
    }

    private func scheduleWaitingTimer() {
        eventLoop.assertInEventLoop()
        guard waitingTimer == nil else { return }
        waitingTimer = eventLoop.scheduleTask(in: .milliseconds(50)) { [self] in
            waitingTimer = nil
            let now = NIODeadline.now()
            var kept = CircularBuffer<Waiting>()
            while let item = waiting.popFirst() {
                if item.deadline <= now {
                    let why = lastError.map { "no connection to \(endpoint) before the deadline: \($0)" }
                        ?? "no connection to \(endpoint) before the deadline"
                    item.completion(.failure(.refused(why)))
                } else {
                    kept.append(item)
                }
            }
            waiting = kept
            if !waiting.isEmpty { scheduleWaitingTimer() }
        }
    }

    private func failWaiting(_ error: HTTP2StreamError) {
        eventLoop.assertInEventLoop()
        while let item = waiting.popFirst() { item.completion(.failure(error)) }
    }
}
