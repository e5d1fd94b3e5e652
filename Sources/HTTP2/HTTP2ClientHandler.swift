public import NIOCore
import CNghttp2
import NIOTLS

/// The client side of one HTTP/2 connection, driven by nghttp2.
///
/// Sits right after the TLS handler. Requests go in through ``execute(_:deadline:completion:)`` on
/// the channel's event loop; the handler never opens more streams than the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS allows (1 until the server's first SETTINGS arrive), queues the
/// rest, sends idle PINGs, and on GOAWAY stops opening streams, lets the in-flight ones finish, and
/// hands back as `.refused` every request the server did not process.
///
/// Everything here runs on the channel's event loop; it is not `Sendable`.
public final class HTTP2ClientHandler: ChannelInboundHandler, NGHTTP2SessionDelegate {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer
    public typealias Completion = (Result<HTTP2Response, HTTP2StreamError>) -> Void

    public struct Configuration: Sendable {
        /// Our own cap on concurrent streams, whatever the server allows.
        public var maxConcurrentStreams: Int = 1000
        /// Send a PING after this long without any frame from the server.
        public var idlePingInterval: TimeAmount = .seconds(60)
        /// Close the connection when a PING is not acknowledged within this time.
        public var pingTimeout: TimeAmount = .seconds(10)
        /// How often deadlines and idleness are checked.
        public var timerResolution: TimeAmount = .milliseconds(50)
        /// Connection-level receive window.
        public var connectionWindow: Int32 = 16 << 20
        /// Responses with a larger body are cancelled (APNs' bodies are a few dozen bytes).
        public var maxResponseBodyBytes: Int = 64 * 1024
        /// Header fields kept per response; the rest are dropped.
        public var maxResponseHeaders: Int = 64
        /// Fail the connection when the server's first SETTINGS do not arrive within this time.
        public var readyTimeout: TimeAmount = .seconds(10)
        /// Fail the connection unless TLS negotiated `h2` through ALPN.
        public var requireALPN: Bool = true
        /// Requests waiting for a free stream at most; more are refused at once.
        public var maxPendingRequests: Int = 10_000
        /// The first request's stream id (odd). Only tests change it, to reach the end of the
        /// stream-id space.
        public var firstStreamID: Int32 = 1

        public init() {}
    }

    public enum Event {
        /// The server's first SETTINGS arrived: requests can flow.
        case ready
        /// The server changed how many concurrent streams it allows (after our own cap).
        case streamLimitChanged(Int)
        /// The server sent GOAWAY; `debugData` is its opaque data as text (APNs sends JSON).
        case goAway(lastStreamID: Int32, errorCode: UInt32, debugData: String)
        /// The connection is closed; the error says why when it was not a clean close.
        case closed(HTTP2Error?)
    }

    private final class Exchange {
        var request: HTTP2Request?
        let deadline: NIODeadline
        var completion: Completion?
        var streamID: Int32 = 0
        var headersSent = false
        var status: Int?
        var headers = HTTP2Headers()
        var body: ByteBuffer?
        var endOfStream = false

        init(request: HTTP2Request, deadline: NIODeadline, completion: @escaping Completion) {
            self.request = request
            self.deadline = deadline
            self.completion = completion
        }

        /// Headers with a status and END_STREAM arrived.
        var isComplete: Bool { endOfStream && status != nil }

        func end(_ end: HTTP2ConnectionStateMachine.StreamEnd) {
            switch end {
            case .response:
                finish(.success(HTTP2Response(status: status ?? 0, headers: headers, body: body)))
            case .failure(let error):
                finish(.failure(error))
            }
        }

        func finish(_ result: Result<HTTP2Response, HTTP2StreamError>) {
            guard let completion else { return }
            self.completion = nil
            completion(result)
        }
    }

    private let configuration: Configuration
    // Stored state below is `@exclusivity(unchecked)`: only this connection's event loop
    // touches it, so accesses never overlap, and the dynamic exclusivity checks cost about 9% of
    // the client's throughput (bench apns, see docs/architecture.md).
    @exclusivity(unchecked) private var session: NGHTTP2Session?
    @exclusivity(unchecked) private var context: ChannelHandlerContext?
    /// The connection's rules (stream limit, GOAWAY, PING, ready deadline); this handler feeds it
    /// events and carries out its answers.
    @exclusivity(unchecked) private var machine: HTTP2ConnectionStateMachine
    @exclusivity(unchecked) private var closeReason: HTTP2Error?
    @exclusivity(unchecked) private var streams: [Int32: Exchange] = [:]
    @exclusivity(unchecked) private var pending = PrecedenceQueue<Exchange>()
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var timer: Scheduled<Void>?
    /// Inside ``channelRead(context:data:)``, which flushes between the pieces of a read: a
    /// write that fails there makes NIO read what is left on the socket and close the channel
    /// before the flush returns. What that reads (bytes after the current read's) waits in
    /// `readLater`, and the close (`closedDuringRead`, with the error if one was caught) waits
    /// until the current read and those bytes were taken in: the answers they hold are answers,
    /// not streams lost with the connection (a lost one is sent again).
    @exclusivity(unchecked) private var reading = false
    @exclusivity(unchecked) private var readLater: ByteBuffer?
    @exclusivity(unchecked) private var closedDuringRead = false
    @exclusivity(unchecked) private var errorDuringRead: (any Error)?

    /// Called on the event loop for every connection-level event.
    public var onEvent: ((Event) -> Void)?

    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        self.machine = HTTP2ConnectionStateMachine(
            configuration: .init(maxConcurrentStreams: configuration.maxConcurrentStreams,
                                 idlePingInterval: configuration.idlePingInterval,
                                 pingTimeout: configuration.pingTimeout, readyTimeout: configuration.readyTimeout),
            now: .now())
    }

    // MARK: Public, event loop only

    /// How many streams may be open at once now.
    public var streamLimit: Int { machine.streamLimit }
    /// Requests on the wire.
    public var openStreams: Int { streams.count }
    /// Requests waiting for a free stream.
    public var pendingRequests: Int { pending.count }
    /// True while new requests are accepted.
    public var isAcceptingRequests: Bool { machine.isAcceptingRequests }
    /// Blocks this connection's nghttp2 session had from the system allocator so far (the rest
    /// it reused: `NGHTTP2Allocator`). Event loop only.
    public var sessionSystemAllocations: Int { session?.systemAllocations ?? 0 }

    /// Sends `request` when a stream is free; `completion` runs exactly once on the event loop.
    public func execute(_ request: HTTP2Request, deadline: NIODeadline, completion: @escaping Completion) {
        guard isAcceptingRequests else {
            completion(.failure(.refused(closeReason?.description ?? "connection is going away")))
            return
        }
        guard pending.count < configuration.maxPendingRequests else {
            completion(.failure(.refused("\(pending.count) requests already wait for a stream")))
            return
        }
        pending.append(Exchange(request: request, deadline: deadline, completion: completion), precedence: request.precedence)
        startPendingStreams()
    }

    /// Starts a graceful shutdown: no new streams, in-flight ones finish, then the connection closes.
    public func shutdown() {
        guard let context, machine.shutdownRequested() else { return }
        failPending(.refused("connection is shutting down"))
        if let session {
            try? session.submitGoAway(lastStreamID: 0, errorCode: HTTP2ErrorCode.noError, debugData: [])
        }
        flush(context)
        closeIfFinished()
    }

    // MARK: Channel events

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { start(context) }
    }

    public func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    private func start(_ context: ChannelHandlerContext) {
        guard session == nil else { return }
        let session = NGHTTP2Session(mode: .client, delegate: self, initialPeerMaxConcurrentStreams: 1)
        self.session = session
        do {
            try session.submitSettings([
                (id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
                (id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
            ])
            try session.setLocalConnectionWindow(configuration.connectionWindow)
            if configuration.firstStreamID != 1 { try session.setNextStreamID(configuration.firstStreamID) }
        } catch {
            fail(context, error)
            return
        }
        machine.frameReceived(now: context.eventLoop.now)
        scheduleTimer(context)
        flush(context)
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tlsEvent,
           configuration.requireALPN, negotiated != "h2" {
            fail(context, .alpnNotNegotiated(negotiated))
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let session, machine.phase != .closed else { return }
        let bytes = unwrapInboundIn(data)
        if reading {
            // Read by NIO from inside one of this read's flushes: after this read's bytes.
            if readLater == nil { readLater = bytes } else { readLater!.writeImmutableBuffer(bytes) }
            return
        }
        machine.frameReceived(now: context.eventLoop.now)
        reading = true
        var next: ByteBuffer? = bytes
        var broken: HTTP2Error?
        do {
            while let input = next {
                try session.receive(input, inPiecesOf: NGHTTP2Session.receivePiece) {
                    // Once the channel closed, the rest is taken in without sending.
                    if !closedDuringRead, errorDuringRead == nil { flush(context) }
                    return machine.phase != .closed
                }
                next = readLater
                readLater = nil
            }
        } catch {
            readLater = nil
            broken = error
        }
        reading = false
        // The read's own failure first (it is why the connection ends), then what NIO reported
        // meanwhile, passed on as it would have been.
        if let broken { fail(context, broken) }
        if let error = errorDuringRead {
            errorDuringRead = nil
            errorCaught(context: context, error: error)
        }
        if closedDuringRead {
            closedDuringRead = false
            channelInactive(context: context)
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        // Fired by NIO from inside one of a read's flushes (see `reading`): nothing to do yet.
        if reading { return context.fireChannelReadComplete() }
        flush(context)
        if let session, !session.isAlive, machine.isAcceptingRequests {
            // nghttp2 ended the session over something the server sent; its GOAWAY went out in
            // the flush above.
            fail(context, .protocolViolation(session.lastPeerError ?? "server broke the HTTP/2 protocol"))
            return
        }
        closeIfFinished()
        context.fireChannelReadComplete()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if reading { return errorDuringRead = errorDuringRead ?? error }
        fail(context, .closed(String(describing: error)))
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if reading { return closedDuringRead = true }
        connectionEnded(closeReason ?? (machine.phase == .goingAway ? nil : .closed("peer closed the connection")))
        context.fireChannelInactive()
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        connectionEnded(closeReason ?? .closed("handler removed"))
        self.context = nil
    }

    // MARK: nghttp2 callbacks

    func streamOpened(_ streamID: Int32) {}

    func requestHeadersSent(_ streamID: Int32) {
        streams[streamID]?.headersSent = true
    }

    func header(_ streamID: Int32, name: String, value: String) {
        guard let exchange = streams[streamID] else { return }
        if name == ":status" {
            exchange.status = Int(value)
        } else if !name.hasPrefix(":"), exchange.headers.fields.count < configuration.maxResponseHeaders {
            exchange.headers.add(name, value)
        }
    }

    func data(_ streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let exchange = streams[streamID], exchange.completion != nil, let context else { return }
        var body = exchange.body ?? context.channel.allocator.buffer(capacity: bytes.count)
        exchange.body = nil
        guard body.readableBytes + bytes.count <= configuration.maxResponseBodyBytes else {
            exchange.finish(.failure(.responseTooLarge(limit: configuration.maxResponseBodyBytes)))
            try? session?.submitResetStream(streamID, errorCode: HTTP2ErrorCode.cancel)
            scheduleFlush(context)
            return
        }
        body.writeBytes(bytes)
        exchange.body = body
    }

    func endOfStream(_ streamID: Int32) {
        streams[streamID]?.endOfStream = true
    }

    func streamClosed(_ streamID: Int32, errorCode: UInt32) {
        guard let exchange = streams.removeValue(forKey: streamID) else { return }
        let end = machine.streamClosed(streamID, errorCode: errorCode, complete: exchange.isComplete,
                                       headersSent: exchange.headersSent,
                                       deadlinePassed: exchange.completion != nil && exchange.deadline <= now)
        exchange.end(end)
        startPendingStreams()
    }

    func settingsReceived() {
        guard let session else { return }
        let change = machine.settingsReceived(maxConcurrentStreams: Int(clamping: session.remoteMaxConcurrentStreams))
        if change.becameReady { onEvent?(.ready) }
        if let limit = change.streamLimit { onEvent?(.streamLimitChanged(limit)) }
        startPendingStreams()
    }

    func goAwayReceived(lastStreamID: Int32, errorCode: UInt32, debugData: [UInt8]) {
        machine.goAwayReceived(lastStreamID: lastStreamID)
        failPending(.refused("server sent GOAWAY"))
        onEvent?(.goAway(lastStreamID: lastStreamID, errorCode: errorCode,
                         debugData: String(decoding: debugData, as: UTF8.self)))
    }

    func pingAcknowledged() {
        machine.pingAcknowledged()
    }

    // MARK: Internals

    /// The time by the connection's event loop (an embedded loop's in tests, which move it by
    /// hand).
    private var now: NIODeadline { context?.eventLoop.now ?? .now() }

    private func startPendingStreams() {
        guard let session, let context else { return }
        var started = false
        while machine.streamsToStart(open: streams.count, pending: pending.count) > 0, let exchange = pending.popFirst() {
            guard exchange.completion != nil, let request = exchange.request else { continue }
            exchange.request = nil
            do {
                let streamID = try session.submitRequest(request)
                exchange.streamID = streamID
                streams[streamID] = exchange
                started = true
            } catch {
                // Stream ids exhausted or the session is failing: not sent, so safe elsewhere.
                exchange.finish(.failure(.refused(error.description)))
                shutdown()
                return
            }
        }
        if started { scheduleFlush(context) }
    }

    /// Coalesces the writes of every request started in this event-loop tick into one flush.
    private func scheduleFlush(_ context: ChannelHandlerContext) {
        guard !flushScheduled else { return }
        flushScheduled = true
        context.eventLoop.assumeIsolated().execute { [self] in
            flushScheduled = false
            if let context = self.context { flush(context) }
        }
    }

    /// Inside nghttp2's receive callbacks this does nothing: `channelReadComplete` flushes once
    /// the bytes were taken in (nghttp2 must not be asked to send from its callbacks).
    private func flush(_ context: ChannelHandlerContext) {
        guard let session, machine.phase != .closed, !session.isReceiving else { return }
        do {
            try session.flush(to: context)
        } catch {
            fail(context, error)
        }
    }

    private func closeIfFinished() {
        // Not from inside nghttp2's callbacks: `channelReadComplete` checks again.
        guard let context, let session, !session.isReceiving,
              machine.shouldClose(openStreams: streams.count, sessionAlive: session.isAlive) else { return }
        context.close(promise: nil)
    }

    private func scheduleTimer(_ context: ChannelHandlerContext) {
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: configuration.timerResolution) { [self] in
            guard let context = self.context, machine.phase != .closed else { return }
            tick(context)
            scheduleTimer(context)
        }
    }

    /// Fires deadlines and keeps the idle PING going.
    private func tick(_ context: ChannelHandlerContext) {
        let now = context.eventLoop.now
        // Requests whose deadline passed while they waited for a stream end, and leave the queue.
        if pending.contains(where: { $0.completion == nil || $0.deadline <= now }) {
            pending.filter { exchange in
                if exchange.completion != nil, exchange.deadline <= now { exchange.finish(.failure(.timedOut)) }
                return exchange.completion != nil
            }
        }
        var cancelled = false
        for (streamID, exchange) in streams where exchange.completion != nil && exchange.deadline <= now {
            exchange.finish(.failure(.timedOut))
            try? session?.submitResetStream(streamID, errorCode: HTTP2ErrorCode.cancel)
            cancelled = true
        }
        switch machine.timerFired(now: now) {
        case .none:
            break
        case .sendPing:
            try? session?.submitPing()
            cancelled = true
        case .fail(let error):
            fail(context, error)
            return
        }
        if cancelled { flush(context) }
    }

    private func failPending(_ error: HTTP2StreamError) {
        while let exchange = pending.popFirst() {
            exchange.finish(.failure(error))
        }
    }

    private func fail(_ context: ChannelHandlerContext, _ error: HTTP2Error) {
        guard machine.phase != .closed else { return }
        if closeReason == nil { closeReason = error }
        connectionEnded(error)
        context.close(promise: nil)
    }

    /// Ends every request, exactly once, and reports the close.
    private func connectionEnded(_ error: HTTP2Error?) {
        let started = session != nil
        guard machine.connectionEnded() else { return }
        timer?.cancel()
        timer = nil
        let why = error?.description ?? "connection closed"
        failPending(.refused(why))
        let open = streams
        streams.removeAll()
        for (streamID, exchange) in open {
            exchange.end(machine.streamAtConnectionEnd(streamID, complete: exchange.isComplete,
                                                       headersSent: exchange.headersSent, why: why))
        }
        // A channel that never became active (the connect failed) reports nothing: whoever
        // connected it has the connect error, which says more.
        if started { onEvent?(.closed(error)) }
        onEvent = nil
    }
}
