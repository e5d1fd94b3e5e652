import CNghttp2
import NIOCore

/// What an nghttp2 session reports while it parses inbound bytes.
///
/// Every method is called synchronously from inside ``NGHTTP2Session/receive(_:)`` or
/// ``NGHTTP2Session/produce(into:)``, so on the channel's event loop.
protocol NGHTTP2SessionDelegate: AnyObject {
    /// A peer-initiated stream opened (server side: a new request).
    func streamOpened(_ streamID: Int32)
    func header(_ streamID: Int32, name: String, value: String)
    func data(_ streamID: Int32, _ bytes: UnsafeRawBufferPointer)
    /// The peer finished sending on this stream (END_STREAM on HEADERS or DATA).
    func endOfStream(_ streamID: Int32)
    /// The stream is closed; `errorCode` is 0 (NO_ERROR) or an HTTP/2 error code.
    func streamClosed(_ streamID: Int32, errorCode: UInt32)
    func settingsReceived()
    func goAwayReceived(lastStreamID: Int32, errorCode: UInt32, debugData: [UInt8])
    func pingAcknowledged()
    /// Our HEADERS frame opening `streamID` went out to the peer.
    func requestHeadersSent(_ streamID: Int32)
}

extension NGHTTP2Session {
    /// Why nghttp2 last gave up on something the peer sent, in its own words.
    var lastPeerError: String? { peerError }
}

/// HTTP/2 error codes this module names (RFC 9113 §7).
public enum HTTP2ErrorCode {
    public static let noError: UInt32 = 0x0
    public static let protocolError: UInt32 = 0x1
    public static let internalError: UInt32 = 0x2
    public static let refusedStream: UInt32 = 0x7
    public static let cancel: UInt32 = 0x8
}

/// Owns one `nghttp2_session`. The C session never escapes this class; it is freed in `deinit`.
///
/// nghttp2 does no I/O here: inbound bytes are fed with ``receive(_:)`` and outbound frames are
/// collected with ``produce(into:)``; the NIO channel handler that owns this object moves them.
/// Not thread-safe: the owning handler calls it on its event loop only.
final class NGHTTP2Session {
    enum Mode { case client, server }

    /// Set once at the end of `init` (it needs `self` as nghttp2's user data); never nil after.
    // Stored state below is `@exclusivity(unchecked)`: only this connection's event loop
    // touches it, so accesses never overlap, and the dynamic exclusivity checks cost about 9% of
    // the client's throughput (bench apns, see docs/architecture.md).
    @exclusivity(unchecked) private var session: OpaquePointer! = nil
    /// Unowned: the delegate (the channel handler) owns this session and outlives it.
    unowned let delegate: any NGHTTP2SessionDelegate
    /// Request or response bodies not yet handed to nghttp2, by stream.
    @exclusivity(unchecked) private var outboundBodies: [Int32: ByteBuffer] = [:]
    /// nghttp2's description of the last error the peer caused (from its error callback).
    @exclusivity(unchecked) fileprivate var peerError: String?
    /// Reused between submits so that building a header list allocates nothing.
    @exclusivity(unchecked) private var scratchBytes: [UInt8] = []
    @exclusivity(unchecked) private var scratchSpans: [(nameStart: Int, nameCount: Int, valueStart: Int, valueCount: Int, indexed: Bool)] = []
    @exclusivity(unchecked) private var scratchNameValues: [nghttp2_nv] = []
    /// Inside `nghttp2_session_mem_recv`: nghttp2 must not be asked to send from its callbacks
    /// (its documented rule); the owning handler defers its flushes until `receive` returned.
    @exclusivity(unchecked) private(set) var isReceiving = false
    /// The session's memory: its small blocks kept for reuse (``NGHTTP2Allocator``). Freed
    /// after the session (stored properties go after `deinit`'s body).
    private let allocator = NGHTTP2Allocator()

    init(mode: Mode, delegate: any NGHTTP2SessionDelegate, initialPeerMaxConcurrentStreams: UInt32? = nil) {
        self.delegate = delegate
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        nghttp2_session_callbacks_set_error_callback2(callbacks, onError)
        if mode == .client {
            nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, onFrameSent)
        }

        var option: OpaquePointer?
        nghttp2_option_new(&option)
        defer { nghttp2_option_del(option) }
        if let initialPeerMaxConcurrentStreams {
            nghttp2_option_set_peer_max_concurrent_streams(option, initialPeerMaxConcurrentStreams)
        }

        var created: OpaquePointer?
        // The user data is this object, unretained: it owns the session, so it is alive whenever
        // nghttp2 can call back (only from inside receive/produce).
        let userData = UnsafeMutableRawPointer(Unmanaged<NGHTTP2Session>.passUnretained(self).toOpaque())
        var memory = allocator.memory
        let rc: Int32
        switch mode {
        case .client: rc = nghttp2_session_client_new3(&created, callbacks, userData, option, &memory)
        case .server: rc = nghttp2_session_server_new3(&created, callbacks, userData, option, &memory)
        }
        guard rc == 0, let created else {
            // Only NGHTTP2_ERR_NOMEM can fail here; nothing sensible is left to do.
            fatalError("nghttp2_session_new failed: \(NGHTTP2Session.describe(rc))")
        }
        self.session = created
    }

    deinit {
        nghttp2_session_del(session)
    }

    static func describe(_ code: Int32) -> String {
        String(cString: nghttp2_strerror(code))
    }

    // MARK: Bytes in and out

    /// Feeds inbound bytes to nghttp2; delegate callbacks fire synchronously.
    func receive(_ buffer: ByteBuffer) throws(HTTP2Error) {
        isReceiving = true
        defer { isReceiving = false }
        let rc = buffer.withUnsafeReadableBytes { bytes -> Int in
            guard let base = bytes.baseAddress else { return 0 }
            return nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        }
        if rc < 0 {
            throw HTTP2Error.protocolViolation(NGHTTP2Session.describe(Int32(rc)))
        }
    }

    /// Takes `buffer` in `piece` bytes at a time, calling `between` after each piece but the
    /// last (outside nghttp2's callbacks, so it may send); the rest is dropped when `between`
    /// says the connection is done (it failed while sending). A handler flushes there: what
    /// the frames of one piece started goes out while the next pieces are read, instead of a
    /// whole read's worth of work going to the peer at once while the peer waits (see
    /// ``receivePiece``).
    func receive(_ buffer: ByteBuffer, inPiecesOf piece: Int, between: () -> Bool) throws(HTTP2Error) {
        var rest = buffer
        while rest.readableBytes > piece, let part = rest.readSlice(length: piece) {
            try receive(part)
            guard between() else { return }
        }
        try receive(rest)
    }

    /// How many received bytes a handler gives nghttp2 at a time before it flushes what they
    /// started (``receive(_:inPiecesOf:between:)``). Two peers that each take a whole read in,
    /// then write a whole batch of answers, work in turn: with a thousand streams in flight on
    /// one connection, a client and the simulator each sat idle half the time (`bench apns`,
    /// docs/performance.md).
    static let receivePiece = 4096

    /// Appends every frame nghttp2 wants to send to `buffer`.
    func produce(into buffer: inout ByteBuffer) throws(HTTP2Error) {
        assert(!isReceiving, "nghttp2_session_mem_send called from inside a nghttp2_session_mem_recv callback")
        while true {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 {
                throw HTTP2Error.protocolViolation(NGHTTP2Session.describe(Int32(count)))
            }
            guard count > 0, let data else { return }
            buffer.writeBytes(UnsafeRawBufferPointer(start: data, count: count))
        }
    }

    /// Writes everything nghttp2 wants to send to the channel, in one flush.
    func flush(to context: ChannelHandlerContext) throws(HTTP2Error) {
        var buffer = context.channel.allocator.buffer(capacity: 0)
        try produce(into: &buffer)
        if buffer.readableBytes > 0 {
            context.writeAndFlush(NIOAny(buffer), promise: nil)
        }
    }

    /// False when the session is finished (GOAWAY exchanged and no stream left, or a fatal error).
    var isAlive: Bool {
        nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0
    }

    /// The id the next request's stream gets (odd, for a client). Tests use it to reach the end
    /// of the stream-id space without a billion requests.
    func setNextStreamID(_ id: Int32) throws(HTTP2Error) {
        let rc = nghttp2_session_set_next_stream_id(session, id)
        if rc != 0 { throw HTTP2Error.protocolViolation(NGHTTP2Session.describe(rc)) }
    }

    var remoteMaxConcurrentStreams: UInt32 {
        nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
    }

    /// Bytes in HPACK's dynamic tables (RFC 7541 §4.1): what this side's encoder and decoder
    /// hold of the header fields sent and received.
    var headerTableSizes: (encoder: Int, decoder: Int) {
        (nghttp2_session_get_hd_deflate_dynamic_table_size(session), nghttp2_session_get_hd_inflate_dynamic_table_size(session))
    }

    /// Blocks the session had from the system allocator so far (``NGHTTP2Allocator``).
    var systemAllocations: Int { allocator.systemAllocations }

    var lastProcessedStreamID: Int32 {
        nghttp2_session_get_last_proc_stream_id(session)
    }

    // MARK: Submitting frames

    func submitSettings(_ settings: [(id: Int32, value: UInt32)]) throws(HTTP2Error) {
        var entries = settings.map { nghttp2_settings_entry(settings_id: $0.id, value: $0.value) }
        let rc = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count)
        try check(rc)
    }

    /// Raises the connection-level receive window so many concurrent streams do not stall.
    func setLocalConnectionWindow(_ size: Int32) throws(HTTP2Error) {
        try check(nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, size))
    }

    /// Submits a request; returns its stream id.
    func submitRequest(_ request: HTTP2Request) throws(HTTP2Error) -> Int32 {
        beginFields()
        addField(":method", request.method)
        addField(":scheme", request.scheme)
        addField(":authority", request.authority)
        addField(":path", request.path)
        addFields(request.headers)
        let hasBody = request.body != nil
        let streamID = withFields { nva, count in
            guard hasBody else { return nghttp2_submit_request(session, nil, nva, count, nil, nil) }
            var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: readBodyCallback)
            return nghttp2_submit_request(session, nil, nva, count, &provider, nil)
        }
        if streamID < 0 { throw HTTP2Error.protocolViolation(NGHTTP2Session.describe(streamID)) }
        if let body = request.body { outboundBodies[streamID] = body }
        return streamID
    }

    func submitResponse(streamID: Int32, _ response: HTTP2Response) throws(HTTP2Error) {
        beginFields()
        addField(":status", String(response.status))
        addFields(response.headers)
        if let body = response.body { outboundBodies[streamID] = body }
        let hasBody = response.body != nil
        let rc = withFields { nva, count in
            guard hasBody else { return nghttp2_submit_response(session, streamID, nva, count, nil) }
            var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: readBodyCallback)
            return nghttp2_submit_response(session, streamID, nva, count, &provider)
        }
        if rc != 0 { outboundBodies[streamID] = nil }
        try check(rc)
    }

    func submitPing() throws(HTTP2Error) {
        try check(nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil))
    }

    func submitResetStream(_ streamID: Int32, errorCode: UInt32) throws(HTTP2Error) {
        try check(nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, errorCode))
    }

    func submitGoAway(lastStreamID: Int32, errorCode: UInt32, debugData: [UInt8]) throws(HTTP2Error) {
        let rc = debugData.withUnsafeBufferPointer { debug in
            nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), lastStreamID, errorCode,
                                  debug.baseAddress, debug.count)
        }
        try check(rc)
    }

    private func check(_ rc: Int32) throws(HTTP2Error) {
        if rc != 0 { throw HTTP2Error.protocolViolation(NGHTTP2Session.describe(rc)) }
    }

    // Header lists are laid out in reused arrays, so that building one allocates nothing:
    // beginFields, addField for each, then withFields lends nghttp2 an `nghttp2_nv` array over
    // them; nghttp2 copies what it keeps before the submit call returns.

    private func beginFields() {
        scratchBytes.removeAll(keepingCapacity: true)
        scratchSpans.removeAll(keepingCapacity: true)
    }

    /// `indexed` false: HPACK sends it as a literal never indexed (``HTTP2Headers/unindexedPositions``).
    private func addField(_ name: String, _ value: String, indexed: Bool = true) {
        let nameStart = scratchBytes.count
        scratchBytes.append(contentsOf: name.utf8)
        let valueStart = scratchBytes.count
        scratchBytes.append(contentsOf: value.utf8)
        scratchSpans.append((nameStart, valueStart - nameStart, valueStart, scratchBytes.count - valueStart, indexed))
    }

    private func addFields(_ headers: HTTP2Headers) {
        for (position, field) in headers.fields.enumerated() {
            addField(field.name, field.value, indexed: headers.isIndexed(at: position))
        }
    }

    private func withFields<R>(_ body: (UnsafeMutablePointer<nghttp2_nv>, Int) -> R) -> R {
        if scratchBytes.isEmpty { scratchBytes.append(0) }  // a valid base address even when empty
        return scratchBytes.withUnsafeMutableBufferPointer { bytes in
            let base = bytes.baseAddress!
            scratchNameValues.removeAll(keepingCapacity: true)
            for span in scratchSpans {
                scratchNameValues.append(nghttp2_nv(
                    name: base + span.nameStart, value: base + span.valueStart,
                    namelen: span.nameCount, valuelen: span.valueCount,
                    flags: UInt8(span.indexed ? NGHTTP2_NV_FLAG_NONE.rawValue : NGHTTP2_NV_FLAG_NO_INDEX.rawValue)))
            }
            return scratchNameValues.withUnsafeMutableBufferPointer { nameValues in
                body(nameValues.baseAddress!, nameValues.count)
            }
        }
    }

    // MARK: Callback targets

    fileprivate func readBody(streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
                              flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard var body = outboundBodies[streamID] else {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let count = min(length, body.readableBytes)
        body.withUnsafeReadableBytes { bytes in
            if count > 0 {
                buffer.update(from: bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), count: count)
            }
        }
        body.moveReaderIndex(forwardBy: count)
        if body.readableBytes == 0 {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            outboundBodies[streamID] = nil
        } else {
            outboundBodies[streamID] = body
        }
        return count
    }

    fileprivate func streamClosed(_ streamID: Int32, errorCode: UInt32) {
        outboundBodies[streamID] = nil
        delegate.streamClosed(streamID, errorCode: errorCode)
    }
}

// MARK: - C callbacks

// Each recovers the session from the unretained user-data pointer set in `init`.
@inline(__always)
private func owner(_ userData: UnsafeMutableRawPointer?) -> NGHTTP2Session {
    Unmanaged<NGHTTP2Session>.fromOpaque(userData!).takeUnretainedValue()
}

private let frameHeaders = UInt8(NGHTTP2_HEADERS.rawValue)
private let frameData = UInt8(NGHTTP2_DATA.rawValue)
private let frameSettings = UInt8(NGHTTP2_SETTINGS.rawValue)
private let framePing = UInt8(NGHTTP2_PING.rawValue)
private let frameGoAway = UInt8(NGHTTP2_GOAWAY.rawValue)
private let flagEndStream = UInt8(NGHTTP2_FLAG_END_STREAM.rawValue)
private let flagAck = UInt8(NGHTTP2_FLAG_ACK.rawValue)

private let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    guard let frame else { return 0 }
    if frame.pointee.hd.type == frameHeaders, frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
        owner(userData).delegate.streamOpened(frame.pointee.hd.stream_id)
    }
    return 0
}

private let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, let name, let value else { return 0 }
    let nameString = String(decoding: UnsafeBufferPointer(start: name, count: nameLength), as: UTF8.self)
    let valueString = String(decoding: UnsafeBufferPointer(start: value, count: valueLength), as: UTF8.self)
    owner(userData).delegate.header(frame.pointee.hd.stream_id, name: nameString, value: valueString)
    return 0
}

private let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, userData in
    owner(userData).delegate.data(streamID, UnsafeRawBufferPointer(start: data, count: length))
    return 0
}

private let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame else { return 0 }
    let delegate = owner(userData).delegate
    let header = frame.pointee.hd
    switch header.type {
    case frameHeaders, frameData:
        if header.flags & flagEndStream != 0 { delegate.endOfStream(header.stream_id) }
    case frameSettings:
        if header.flags & flagAck == 0 { delegate.settingsReceived() }
    case framePing:
        if header.flags & flagAck != 0 { delegate.pingAcknowledged() }
    case frameGoAway:
        let goAway = frame.pointee.goaway
        var debug: [UInt8] = []
        if let opaque = goAway.opaque_data, goAway.opaque_data_len > 0 {
            debug = Array(UnsafeBufferPointer(start: opaque, count: min(goAway.opaque_data_len, 4096)))
        }
        delegate.goAwayReceived(lastStreamID: goAway.last_stream_id, errorCode: goAway.error_code, debugData: debug)
    default:
        break
    }
    return 0
}

private let onFrameSent: nghttp2_on_frame_send_callback = { _, frame, userData in
    guard let frame else { return 0 }
    if frame.pointee.hd.type == frameHeaders, frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
        owner(userData).delegate.requestHeadersSent(frame.pointee.hd.stream_id)
    }
    return 0
}

private let onError: nghttp2_error_callback2 = { _, _, message, length, userData in
    if let message {
        let text = String(decoding: UnsafeRawBufferPointer(start: message, count: length), as: UTF8.self)
        owner(userData).peerError = text
    }
    return 0
}

private let onStreamClose: nghttp2_on_stream_close_callback = { _, streamID, errorCode, userData in
    owner(userData).streamClosed(streamID, errorCode: errorCode)
    return 0
}

private let readBodyCallback: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, _, userData in
    guard let buffer, let flags else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    return owner(userData).readBody(streamID: streamID, into: buffer, length: length, flags: flags)
}
