import APNs
import Foundation
import HTTP2
import NIOCore
import NIOEmbedded
import Testing

/// What the server application of an in-memory pair does: keeps every request, and answers
/// it at once with 200 unless told to hold it.
final class PairServerApplication: HTTP2ServerDelegate {
    var requests: [(streamID: Int32, request: HTTP2Request)] = []
    var holds = false
    var closed = false

    func handle(_ request: HTTP2Request, streamID: Int32, connection: HTTP2ServerHandler) {
        requests.append((streamID, request))
        if !holds { connection.respond(streamID: streamID, HTTP2Response(status: 200)) }
    }

    func connectionClosed(_ connection: HTTP2ServerHandler) {
        closed = true
    }
}

/// The HTTP/2 client and server handlers joined in memory on one embedded event loop: what
/// either writes is what the other reads, moved by ``exchange(chunk:)`` until neither has more
/// to say. Time is the loop's, advanced by hand, so idle PINGs and the ready deadline need no
/// waiting; bytes can be handed over in pieces of any size.
final class HTTP2Pair {
    let loop = EmbeddedEventLoop()
    let client: EmbeddedChannel
    let server: EmbeddedChannel
    let clientHandler: HTTP2ClientHandler
    let serverHandler: HTTP2ServerHandler
    let application = PairServerApplication()
    var events: [HTTP2ClientHandler.Event] = []
    var results: [Int: Result<HTTP2Response, HTTP2StreamError>] = [:]

    init(configure: (inout HTTP2ClientHandler.Configuration) -> Void = { _ in }, serverStreams: UInt32 = 100,
         clientFront: (any ChannelHandler)? = nil, serverFront: (any ChannelHandler)? = nil) throws {
        var configuration = HTTP2ClientHandler.Configuration()
        configuration.requireALPN = false
        configure(&configuration)
        clientHandler = HTTP2ClientHandler(configuration: configuration)
        serverHandler = HTTP2ServerHandler(maxConcurrentStreams: serverStreams, delegate: application)
        client = EmbeddedChannel(loop: loop)
        server = EmbeddedChannel(loop: loop)
        if let clientFront { try client.pipeline.syncOperations.addHandler(clientFront) }
        try client.pipeline.syncOperations.addHandler(clientHandler)
        if let serverFront { try server.pipeline.syncOperations.addHandler(serverFront) }
        try server.pipeline.syncOperations.addHandler(serverHandler)
        clientHandler.onEvent = { [unowned self] in events.append($0) }
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 443)
        try server.connect(to: address).wait()
        try client.connect(to: address).wait()
    }

    /// Sends a request; its result lands in ``results`` under `index`.
    func send(_ index: Int, deadline: NIODeadline? = nil) {
        let request = HTTP2Request(authority: "api.example", path: "/3/device/\(index)", headers: [:], body: nil)
        clientHandler.execute(request, deadline: deadline ?? loop.now + .seconds(60)) { [unowned self] in results[index] = $0 }
    }

    /// Sends an APNs notification's request for device `index`; its result lands in ``results``
    /// under `index`, then `then` runs.
    func sendNotification(_ index: Int, then: @escaping () -> Void = {}) {
        let notification = APNsNotification.alert("x", deviceToken: token(index), topic: sampleTopic)
        let request = APNsClient.request(for: notification, apnsID: UUID().uuidString, authority: "api.example")
        clientHandler.execute(request, deadline: loop.now + .seconds(60)) { [unowned self] in
            results[index] = $0
            then()
        }
    }

    /// Moves bytes both ways, in pieces of `chunk` bytes when given, until neither side writes.
    func exchange(chunk: Int? = nil) throws {
        var moved = true
        while moved {
            let sent = try move(from: client, to: server, chunk: chunk)
            let answered = try move(from: server, to: client, chunk: chunk)
            moved = sent || answered
        }
    }

    /// Hands what `from` wrote to `to`; true when there was something.
    @discardableResult
    func move(from: EmbeddedChannel, to: EmbeddedChannel, chunk: Int? = nil) throws -> Bool {
        loop.run()  // the handlers flush from tasks they put on the loop
        var moved = false
        while var buffer = try from.readOutbound(as: ByteBuffer.self) {
            moved = true
            guard to.isActive else { continue }
            while buffer.readableBytes > 0 {
                let piece = buffer.readSlice(length: min(chunk ?? buffer.readableBytes, buffer.readableBytes))!
                try to.writeInbound(piece)
            }
        }
        return moved
    }

    /// Hands everything `from` wrote to `to` as one read; how many writes `to` made meanwhile.
    func moveInOneRead(from: EmbeddedChannel, to: EmbeddedChannel) throws -> Int {
        loop.run()
        var whole = from.allocator.buffer(capacity: 0)
        while var buffer = try from.readOutbound(as: ByteBuffer.self) { whole.writeBuffer(&buffer) }
        try to.writeInbound(whole)
        loop.run()
        var writes = 0
        var written = from.allocator.buffer(capacity: 0)
        while var buffer = try to.readOutbound(as: ByteBuffer.self) {
            writes += 1
            written.writeBuffer(&buffer)
        }
        // Put back as one, for the next move.
        if writes > 0 { try to.writeOutbound(written) }
        return writes
    }

    /// Drops what `channel` wrote (lost on the way).
    func discardOutbound(_ channel: EmbeddedChannel) throws {
        loop.run()
        while try channel.readOutbound(as: ByteBuffer.self) != nil {}
    }

    var closedEvents: [HTTP2Error?] {
        events.compactMap { if case .closed(let error) = $0 { return .some(error) } else { return nil } }
    }

    func finish() {
        _ = try? client.finish(acceptAlreadyClosed: true)
        _ = try? server.finish(acceptAlreadyClosed: true)
    }
}

/// Does to the next flush what NIO does to a flush whose write fails: reads what is left on the
/// socket (`drained`, then a read-complete), then closes the channel, all before the flush
/// returns; the flush's bytes are lost.
final class FlushFailsAfterReading: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var drained: ByteBuffer?
    private(set) var fired = false

    func arm(drained: ByteBuffer) {
        self.drained = drained
    }

    func flush(context: ChannelHandlerContext) {
        guard let drained else { return context.flush() }
        self.drained = nil
        fired = true
        context.fireChannelRead(wrapInboundOut(drained))
        context.fireChannelReadComplete()
        context.close(promise: nil)
    }
}

/// The HTTP/2 client handler against the server handler, in memory and on a hand-driven
/// clock: SETTINGS changes, GOAWAY in pieces, refused streams, a connection lost after a
/// request was written, PING and ready deadlines.
@Suite("HTTP/2 handlers in memory", .timeLimit(.minutes(1)))
struct HTTP2PairTests {
    /// Until the server's first SETTINGS, one stream; then its limit, and each later change.
    @Test func theStreamLimitFollowsTheServersSettings() throws {
        let pair = try HTTP2Pair(serverStreams: 2)
        defer { pair.finish() }
        pair.application.holds = true
        #expect(pair.clientHandler.streamLimit == 1)
        try pair.exchange()
        #expect(pair.events.contains { if case .ready = $0 { true } else { false } })
        #expect(pair.clientHandler.streamLimit == 2)
        for index in 0..<5 { pair.send(index) }
        try pair.exchange()
        #expect(pair.application.requests.count == 2 && pair.clientHandler.pendingRequests == 3, "\(pair.results) \(pair.events) \(pair.serverHandler.failure ?? "-")")
        pair.serverHandler.setMaxConcurrentStreams(4)
        try pair.exchange()
        #expect(pair.clientHandler.streamLimit == 4)
        #expect(pair.events.contains { if case .streamLimitChanged(4) = $0 { true } else { false } })
        #expect(pair.application.requests.count == 4 && pair.serverHandler.peakConcurrentStreams == 4)
        // Answered, the last one goes out too.
        for (streamID, _) in pair.application.requests { pair.serverHandler.respond(streamID: streamID, HTTP2Response(status: 200)) }
        try pair.exchange()
        pair.serverHandler.respond(streamID: pair.application.requests[4].streamID, HTTP2Response(status: 200))
        try pair.exchange()
        #expect(pair.results.count == 5 && pair.results.values.allSatisfy { (try? $0.get().status) == 200 })
    }

    /// An APNs request's `apns-id` goes as a literal never indexed (RFC 7541 §6.2.3): the
    /// server's HPACK decoder keeps what every request repeats (authority, topic, push type,
    /// priority), about 200 bytes, not an entry per id — 200 of them, 75 bytes each, would fill
    /// its 4,096-byte table and push the repeated fields out.
    @Test func aRequestsOwnIDStaysOutOfThePeersHeaderTable() throws {
        let pair = try HTTP2Pair()
        defer { pair.finish() }
        try pair.exchange()
        let count = 200
        for index in 0..<count {
            let notification = APNsNotification.alert("x", deviceToken: token(index), topic: sampleTopic)
            let request = APNsClient.request(for: notification, apnsID: UUID().uuidString, authority: "api.example")
            pair.clientHandler.execute(request, deadline: pair.loop.now + .seconds(60)) { [unowned pair] in pair.results[index] = $0 }
            try pair.exchange()
        }
        #expect(pair.results.count == count && pair.results.values.allSatisfy { (try? $0.get().status) == 200 })
        #expect(Set(pair.application.requests.compactMap { $0.request.headers["apns-id"] }).count == count)
        #expect(pair.serverHandler.headerDecoderTableSize < 512, "\(pair.serverHandler.headerDecoderTableSize) bytes")
    }

    /// nghttp2's per-stream blocks are reused: once a connection has carried requests, a
    /// thousand more take almost nothing from the system allocator (nghttp2 asks for four
    /// blocks per request, which `malloc` served each time), and every answer still comes whole.
    @Test func aConnectionsStreamsReuseNghttp2sMemory() throws {
        let pair = try HTTP2Pair()
        defer { pair.finish() }
        try pair.exchange()
        func round(_ indices: Range<Int>) throws {
            for chunk in stride(from: indices.lowerBound, to: indices.upperBound, by: 50) {
                for index in chunk..<min(chunk + 50, indices.upperBound) { pair.sendNotification(index) }
                try pair.exchange()
            }
        }
        try round(0..<200)
        let warm = pair.clientHandler.sessionSystemAllocations
        try round(200..<1200)
        let taken = pair.clientHandler.sessionSystemAllocations - warm
        #expect(pair.results.count == 1200 && pair.results.values.allSatisfy { (try? $0.get().status) == 200 })
        #expect(warm > 0)
        #expect(taken < 50, "\(taken) blocks from the system for 1,000 requests")
    }

    /// A read of many frames is taken in 4 KB pieces, and what each piece started is written
    /// before the next is read: 600 requests in one read are answered in several writes, and
    /// 600 answers in one read (10 bytes each here), each of whose callbacks sends another
    /// request, send them in several. (Answered only once the whole read was taken in, the two sides of a busy
    /// connection worked in turn, each idle while the other worked: docs/performance.md.)
    @Test func aLargeReadIsAnsweredPieceByPiece() throws {
        let pair = try HTTP2Pair(serverStreams: 1000)
        defer { pair.finish() }
        try pair.exchange()
        let count = 600
        for index in 0..<count {
            pair.sendNotification(index) { [unowned pair] in pair.send(count + index) }
        }
        let answerWrites = try pair.moveInOneRead(from: pair.client, to: pair.server)
        #expect(pair.application.requests.count == count)
        #expect(answerWrites > 1, "\(count) requests answered in \(answerWrites) write")
        let requestWrites = try pair.moveInOneRead(from: pair.server, to: pair.client)
        #expect((0..<count).allSatisfy { (try? pair.results[$0]?.get().status) == 200 })
        #expect(requestWrites > 1, "\(count) requests sent in \(requestWrites) write")
        try pair.exchange()
        #expect(pair.results.count == 2 * count && pair.results.values.allSatisfy { (try? $0.get().status) == 200 })
    }

    /// A write that fails between the pieces of a read of answers (NIO then reads what is left on
    /// the socket and closes the channel before the flush returns): every answer in the rest of
    /// the read, and in what NIO read then, reaches its request — none ends as lost with the
    /// connection, to be sent again — and the connection ends after them, ending the requests
    /// the answers' callbacks had started.
    @Test func aWriteThatFailsInTheMiddleOfAReadLosesNoAnswerOfIt() throws {
        let failing = FlushFailsAfterReading()
        let pair = try HTTP2Pair(serverStreams: 1000, clientFront: failing)
        defer { pair.finish() }
        try pair.exchange()
        let count = 1000
        for index in 0..<count {
            pair.sendNotification(index) { [unowned pair] in pair.send(count + index) }
        }
        try pair.move(from: pair.client, to: pair.server)
        pair.loop.run()
        var answers = pair.server.allocator.buffer(capacity: 0)
        while var buffer = try pair.server.readOutbound(as: ByteBuffer.self) { answers.writeBuffer(&buffer) }
        // The client reads 6,000 bytes of them (two pieces and part of a frame); the rest is
        // what NIO reads when the flush between the pieces fails.
        #expect(answers.readableBytes > 8_000)
        let first = answers.readSlice(length: 6_000)!
        failing.arm(drained: answers)
        try pair.client.writeInbound(first)
        pair.loop.run()
        #expect(failing.fired)
        let answered = (0..<count).filter { (try? pair.results[$0]?.get().status) == 200 }.count
        #expect(answered == count, "\(count - answered) answers lost: \(pair.results[0].map { "\($0)" } ?? "none")")
        #expect(!pair.client.isActive)
        #expect(pair.closedEvents.count == 1)
        #expect((count..<2 * count).allSatisfy { index in pair.results[index].map { (try? $0.get()) == nil } ?? false })
    }

    /// The server meets the same failed write between the pieces of a read of requests: what
    /// NIO read then comes after the read's bytes, not in the middle of a frame, so nghttp2
    /// sees no broken frame (the connection is closed, and what came after the failed write is
    /// not taken in).
    @Test func aServerWriteThatFailsInTheMiddleOfAReadBreaksNoFrame() throws {
        let failing = FlushFailsAfterReading()
        let pair = try HTTP2Pair(serverStreams: 1000, serverFront: failing)
        defer { pair.finish() }
        try pair.exchange()
        for index in 0..<600 { pair.sendNotification(index) }
        pair.loop.run()
        var requests = pair.client.allocator.buffer(capacity: 0)
        while var buffer = try pair.client.readOutbound(as: ByteBuffer.self) { requests.writeBuffer(&buffer) }
        // The server reads all but the last 3,000 bytes (the requests' HEADERS come first, then
        // their bodies); the rest is what NIO reads when a flush of answers fails.
        #expect(requests.readableBytes > 12_000)
        let first = requests.readSlice(length: requests.readableBytes - 3_000)!
        failing.arm(drained: requests)
        try pair.server.writeInbound(first)
        pair.loop.run()
        #expect(failing.fired)
        #expect(pair.serverHandler.failure == nil)
        #expect(!pair.server.isActive)
        #expect(pair.application.requests.count > 0 && pair.application.requests.count < 600)
    }

    /// A GOAWAY read a byte at a time: the streams it names as processed are answered, the one
    /// sent after it is refused (never processed, so safe to send again), its debug data
    /// arrives whole, and the connection closes once the answered ones are done.
    @Test func aGoAwayInPiecesRefusesOnlyWhatTheServerDidNotProcess() throws {
        let pair = try HTTP2Pair()
        defer { pair.finish() }
        pair.application.holds = true
        try pair.exchange()
        pair.send(0)
        pair.send(1)
        try pair.exchange(chunk: 1)
        #expect(pair.application.requests.count == 2)
        pair.serverHandler.goAway(debugData: #"{"reason":"Shutdown"}"#)
        pair.send(2)
        try pair.exchange(chunk: 1)
        #expect(pair.events.contains { event in
            if case .goAway(lastStreamID: 3, errorCode: 0, debugData: #"{"reason":"Shutdown"}"#) = event { true } else { false }
        }, "\(pair.events)")
        #expect(pair.application.requests.count == 2)
        guard case .failure(.refused)? = pair.results[2] else {
            Issue.record("the request after the GOAWAY: \(String(describing: pair.results[2]))")
            return
        }
        #expect(pair.results[0] == nil && pair.results[1] == nil)
        #expect(!pair.clientHandler.isAcceptingRequests)
        for (streamID, _) in pair.application.requests { pair.serverHandler.respond(streamID: streamID, HTTP2Response(status: 200)) }
        try pair.exchange(chunk: 7)
        #expect((try? pair.results[0]?.get().status) == 200 && (try? pair.results[1]?.get().status) == 200)
        #expect(!pair.client.isActive && pair.closedEvents.count == 1)
    }

    /// REFUSED_STREAM outside a GOAWAY: that request is refused (not processed), another
    /// stream's reset says its code, and the connection goes on.
    @Test func aRefusedStreamIsRefusedAndTheConnectionGoesOn() throws {
        let pair = try HTTP2Pair()
        defer { pair.finish() }
        pair.application.holds = true
        try pair.exchange()
        for index in 0..<3 { pair.send(index) }
        try pair.exchange()
        let streams = pair.application.requests.map(\.streamID)
        pair.serverHandler.resetStream(streams[0], errorCode: HTTP2ErrorCode.refusedStream)
        pair.serverHandler.resetStream(streams[1], errorCode: HTTP2ErrorCode.internalError)
        pair.serverHandler.respond(streamID: streams[2], HTTP2Response(status: 200))
        try pair.exchange()
        guard case .failure(.refused)? = pair.results[0] else {
            Issue.record("REFUSED_STREAM: \(String(describing: pair.results[0]))")
            return
        }
        guard case .failure(.reset(HTTP2ErrorCode.internalError))? = pair.results[1] else {
            Issue.record("reset: \(String(describing: pair.results[1]))")
            return
        }
        #expect((try? pair.results[2]?.get().status) == 200)
        pair.application.holds = false
        pair.send(3)
        try pair.exchange()
        #expect((try? pair.results[3]?.get().status) == 200 && pair.client.isActive)
    }

    /// The connection dies with a request written and another still queued: the written one
    /// is lost (the server may have processed it: not to be sent again), the queued one refused.
    @Test func aRequestWrittenBeforeTheConnectionDiedIsLostNotRefused() throws {
        let pair = try HTTP2Pair(serverStreams: 1)
        defer { pair.finish() }
        pair.application.holds = true
        try pair.exchange()
        pair.send(0)
        pair.send(1)
        try pair.exchange()
        #expect(pair.application.requests.count == 1 && pair.clientHandler.pendingRequests == 1)
        pair.client.pipeline.fireChannelInactive()
        guard case .failure(.connectionLost)? = pair.results[0] else {
            Issue.record("written: \(String(describing: pair.results[0]))")
            return
        }
        guard case .failure(.refused)? = pair.results[1] else {
            Issue.record("queued: \(String(describing: pair.results[1]))")
            return
        }
        #expect(pair.closedEvents.count == 1)
    }

    /// Idle for the PING interval, the client PINGs; answered, the connection stays; a PING
    /// lost on the way closes it at the PING timeout, failing the request on it as lost.
    @Test func anUnansweredPingClosesTheConnectionAtItsTimeout() throws {
        let pair = try HTTP2Pair {
            $0.idlePingInterval = .seconds(5)
            $0.pingTimeout = .seconds(2)
        }
        defer { pair.finish() }
        try pair.exchange()
        // Idle since 0 s: the PING goes out at the first 50 ms tick past 5 s, and is answered.
        pair.loop.advanceTime(by: .seconds(6))
        #expect(try pair.move(from: pair.client, to: pair.server), "a PING went out")
        try pair.exchange()
        pair.loop.advanceTime(by: .seconds(3))
        #expect(pair.client.isActive, "the PING was answered")
        // A request at 9 s that the server holds; the client last heard from it at 6 s (the
        // PING's answer): the next PING goes out just past 11 s, and is lost.
        pair.application.holds = true
        pair.send(0)
        try pair.exchange()
        pair.loop.advanceTime(by: .milliseconds(2_100))
        pair.loop.run()
        #expect(try pair.client.readOutbound(as: ByteBuffer.self) != nil, "a second PING went out")
        try pair.discardOutbound(pair.client)
        pair.loop.advanceTime(by: .milliseconds(1_850))
        #expect(pair.client.isActive, "not before the PING timeout")
        pair.loop.advanceTime(by: .milliseconds(300))
        #expect(!pair.client.isActive)
        #expect(pair.closedEvents.count == 1 && pair.closedEvents.first == .some(.pingTimeout), "\(pair.events)")
        guard case .failure(.connectionLost)? = pair.results[0] else {
            Issue.record("the request on the connection: \(String(describing: pair.results[0]))")
            return
        }
    }

    /// A server that never sends its SETTINGS: the connection fails at the ready timeout, not
    /// before, and the request waiting for it is refused (never sent).
    @Test func noSettingsWithinTheReadyTimeoutFailsTheConnection() throws {
        let pair = try HTTP2Pair { $0.readyTimeout = .seconds(3) }
        defer { pair.finish() }
        try pair.discardOutbound(pair.server)
        try pair.move(from: pair.client, to: pair.server)
        try pair.discardOutbound(pair.server)
        pair.send(0)
        pair.loop.advanceTime(by: .milliseconds(2_900))
        #expect(pair.client.isActive && pair.results.isEmpty)
        pair.loop.advanceTime(by: .milliseconds(200))
        #expect(!pair.client.isActive)
        #expect(pair.closedEvents.first == .some(.connectTimeout), "\(pair.events)")
        guard case .failure(.refused)? = pair.results[0] else {
            Issue.record("the waiting request: \(String(describing: pair.results[0]))")
            return
        }
    }
}
