public import NIOCore
import CNghttp2
import NIOTLS

/// What a server application does with the requests of one connection. Called on the
/// connection's event loop.
public protocol HTTP2ServerDelegate: AnyObject {
    /// A complete request arrived on `streamID`; answer it, now or later, with
    /// ``HTTP2ServerHandler/respond(streamID:_:)`` on the same event loop.
    func handle(_ request: HTTP2Request, streamID: Int32, connection: HTTP2ServerHandler)
    /// The connection closed.
    func connectionClosed(_ connection: HTTP2ServerHandler)
}

/// The server side of one HTTP/2 connection, driven by nghttp2 (the same engine as the client).
///
/// nghttp2 enforces our SETTINGS: a client that opens more streams than
/// SETTINGS_MAX_CONCURRENT_STREAMS allows gets the connection closed with PROTOCOL_ERROR.
public final class HTTP2ServerHandler: ChannelInboundHandler, NGHTTP2SessionDelegate {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    private struct IncomingRequest {
        var method = ""
        var scheme = ""
        var authority = ""
        var path = ""
        var headers = HTTP2Headers()
        var body: ByteBuffer?
    }

    // Stored state below is `@exclusivity(unchecked)`: only this connection's event loop
    // touches it, so accesses never overlap, and the dynamic exclusivity checks cost about 9% of
    // the client's throughput (bench apns, see docs/architecture.md).
    @exclusivity(unchecked) private var session: NGHTTP2Session?
    @exclusivity(unchecked) private var context: ChannelHandlerContext?
    @exclusivity(unchecked) private var requests: [Int32: IncomingRequest] = [:]
    @exclusivity(unchecked) private var openStreamIDs = Set<Int32>()
    private let initialMaxConcurrentStreams: UInt32
    private let delegate: any HTTP2ServerDelegate
    @exclusivity(unchecked) private var inRead = false
    /// Bytes NIO read from inside a flush of ``channelRead(context:data:)``, taken in after it.
    @exclusivity(unchecked) private var readLater: ByteBuffer?
    @exclusivity(unchecked) private var closed = false
    @exclusivity(unchecked) private var goingAway = false
    /// The last-stream-id of the GOAWAY we sent: requests above it are refused, never processed.
    @exclusivity(unchecked) private var goAwayLastStreamID: Int32 = .max

    /// The most streams that were open at once on this connection.
    @exclusivity(unchecked) public private(set) var peakConcurrentStreams = 0
    /// Why the connection failed, when it did (a client protocol violation, for instance).
    @exclusivity(unchecked) public private(set) var failure: String?
    /// The MAX_CONCURRENT_STREAMS we last advertised.
    @exclusivity(unchecked) public private(set) var advertisedMaxConcurrentStreams: UInt32

    /// Request bodies are kept up to this size plus one byte; the rest is read and dropped.
    private let maxRequestBodyBytes: Int

    public init(maxConcurrentStreams: UInt32, maxRequestBodyBytes: Int = 64 * 1024, delegate: any HTTP2ServerDelegate) {
        self.initialMaxConcurrentStreams = maxConcurrentStreams
        self.maxRequestBodyBytes = maxRequestBodyBytes
        self.advertisedMaxConcurrentStreams = maxConcurrentStreams
        self.delegate = delegate
    }

    public var channel: (any Channel)? { context?.channel }
    public var openStreams: Int { openStreamIDs.count }
    /// Bytes of header fields this connection's HPACK decoder keeps in its dynamic table (RFC
    /// 7541 §4.1): what the client's indexed fields cost this side. Event loop only.
    public var headerDecoderTableSize: Int { session?.headerTableSizes.decoder ?? 0 }

    // MARK: Public, event loop only

    public func respond(streamID: Int32, _ response: HTTP2Response) {
        guard let session, !closed, openStreamIDs.contains(streamID) else { return }
        submit { () throws(HTTP2Error) in try session.submitResponse(streamID: streamID, response) }
    }

    /// Resets a stream (RST_STREAM with `errorCode`; REFUSED_STREAM says it was not processed).
    public func resetStream(_ streamID: Int32, errorCode: UInt32) {
        guard let session, !closed, openStreamIDs.contains(streamID) else { return }
        submit { () throws(HTTP2Error) in try session.submitResetStream(streamID, errorCode: errorCode) }
    }

    /// Closes the connection at once, without GOAWAY: its open streams get no answer.
    public func abort() {
        context?.close(promise: nil)
    }

    /// Advertises a new SETTINGS_MAX_CONCURRENT_STREAMS.
    public func setMaxConcurrentStreams(_ value: UInt32) {
        guard let session, !closed, value != advertisedMaxConcurrentStreams else { return }
        advertisedMaxConcurrentStreams = value
        submit(closingWhenDone: false) { () throws(HTTP2Error) in
            try session.submitSettings([(id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: value)])
        }
    }

    /// Sends GOAWAY naming the last stream this server processed, with `debugData` (APNs sends
    /// `{"reason":"..."}`); streams above it are refused, streams below it still get answered,
    /// and the connection closes once they have been.
    public func goAway(errorCode: UInt32 = HTTP2ErrorCode.noError, debugData: String) {
        guard let session, !closed, !goingAway else { return }
        goingAway = true
        goAwayLastStreamID = session.lastProcessedStreamID
        let lastStreamID = goAwayLastStreamID
        submit { () throws(HTTP2Error) in
            try session.submitGoAway(lastStreamID: lastStreamID, errorCode: errorCode, debugData: Array(debugData.utf8))
        }
    }

    /// Queues a frame with `body`; outside a read, sends it now (and, with `closingWhenDone`,
    /// closes the connection if that was its last stream after a GOAWAY). A failure fails the
    /// connection.
    private func submit(closingWhenDone: Bool = true, _ body: () throws(HTTP2Error) -> Void) {
        guard let context else { return }
        do {
            try body()
        } catch {
            fail(context, error.description)
            return
        }
        if !inRead {
            flush(context)
            if closingWhenDone { closeIfFinished(context) }
        }
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
        let session = NGHTTP2Session(mode: .server, delegate: self)
        self.session = session
        do {
            try session.submitSettings([
                (id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: initialMaxConcurrentStreams),
                (id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
            ])
            try session.setLocalConnectionWindow(16 << 20)
        } catch {
            fail(context, error.description)
            return
        }
        flush(context)
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tlsEvent,
           negotiated != "h2" {
            fail(context, HTTP2Error.alpnNotNegotiated(negotiated).description)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let session, !closed else { return }
        let bytes = unwrapInboundIn(data)
        if inRead {
            // Read by NIO from inside one of this read's flushes (a write that failed drains the
            // socket before the channel closes): after this read's bytes, not in their middle.
            if readLater == nil { readLater = bytes } else { readLater!.writeImmutableBuffer(bytes) }
            return
        }
        inRead = true
        defer {
            inRead = false
            readLater = nil
        }
        var next: ByteBuffer? = bytes
        do {
            while let input = next, !closed {
                try session.receive(input, inPiecesOf: NGHTTP2Session.receivePiece) {
                    flush(context)
                    return !closed
                }
                next = readLater
                readLater = nil
            }
        } catch {
            fail(context, error.description)
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        // Fired by NIO from inside one of a read's flushes: the read flushes when it is done.
        if inRead { return context.fireChannelReadComplete() }
        flush(context)
        closeIfFinished(context)
        context.fireChannelReadComplete()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context, String(describing: error))
    }

    public func channelInactive(context: ChannelHandlerContext) {
        markClosed()
        context.fireChannelInactive()
    }

    /// Lets go of the channel (its context holds this handler: a cycle until then) and of the
    /// nghttp2 session.
    public func handlerRemoved(context: ChannelHandlerContext) {
        markClosed()
        self.context = nil
        session = nil
    }

    // MARK: nghttp2 callbacks

    func streamOpened(_ streamID: Int32) {
        requests[streamID] = IncomingRequest()
        openStreamIDs.insert(streamID)
        peakConcurrentStreams = max(peakConcurrentStreams, openStreamIDs.count)
    }

    func header(_ streamID: Int32, name: String, value: String) {
        guard requests[streamID] != nil else { return }
        switch name {
        case ":method": requests[streamID]!.method = value
        case ":scheme": requests[streamID]!.scheme = value
        case ":authority": requests[streamID]!.authority = value
        case ":path": requests[streamID]!.path = value
        default:
            // nghttp2 bounds each field; this bounds how many are kept.
            if requests[streamID]!.headers.fields.count < 64 { requests[streamID]!.headers.add(name, value) }
        }
    }

    func data(_ streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let context, var request = requests[streamID] else { return }
        var body = request.body ?? context.channel.allocator.buffer(capacity: bytes.count)
        // Keep at most one byte past the limit: enough for the application to see "too large".
        let room = maxRequestBodyBytes + 1 - body.readableBytes
        if room > 0 { body.writeBytes(UnsafeRawBufferPointer(rebasing: bytes.prefix(room))) }
        request.body = body
        requests[streamID] = request
    }

    func endOfStream(_ streamID: Int32) {
        guard let incoming = requests.removeValue(forKey: streamID) else { return }
        if streamID > goAwayLastStreamID {
            // nghttp2 still parses streams that arrive before our GOAWAY is on the wire; the
            // GOAWAY promised the client they were not processed, so refuse them.
            try? session?.submitResetStream(streamID, errorCode: HTTP2ErrorCode.refusedStream)
            return
        }
        let request = HTTP2Request(method: incoming.method, scheme: incoming.scheme, authority: incoming.authority,
                                   path: incoming.path, headers: incoming.headers, body: incoming.body)
        delegate.handle(request, streamID: streamID, connection: self)
    }

    func streamClosed(_ streamID: Int32, errorCode: UInt32) {
        requests[streamID] = nil
        openStreamIDs.remove(streamID)
    }

    func settingsReceived() {}
    func goAwayReceived(lastStreamID: Int32, errorCode: UInt32, debugData: [UInt8]) {
        goingAway = true
    }
    func pingAcknowledged() {}
    func requestHeadersSent(_ streamID: Int32) {}

    // MARK: Internals

    private func flush(_ context: ChannelHandlerContext) {
        guard let session, !closed else { return }
        do {
            try session.flush(to: context)
        } catch {
            fail(context, error.description)
        }
    }

    private func closeIfFinished(_ context: ChannelHandlerContext) {
        guard let session, !closed else { return }
        if !session.isAlive, !goingAway, failure == nil {
            // nghttp2 ended the session itself: the client broke the protocol.
            failure = "client violated the HTTP/2 protocol"
        }
        if !session.isAlive || (goingAway && openStreamIDs.isEmpty) {
            context.close(promise: nil)
        }
    }

    private func fail(_ context: ChannelHandlerContext, _ why: String) {
        guard !closed else { return }
        if failure == nil { failure = why }
        // Tell the peer what went wrong when nghttp2 has not already done so.
        flush(context)
        markClosed()
        context.close(promise: nil)
    }

    private func markClosed() {
        guard !closed else { return }
        closed = true
        requests.removeAll()
        openStreamIDs.removeAll()
        delegate.connectionClosed(self)
    }
}
