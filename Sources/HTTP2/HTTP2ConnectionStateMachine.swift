public import NIOCore

/// The rules of one HTTP/2 client connection, apart from any I/O: when requests may start, what
/// SETTINGS, GOAWAY and PING change, when the connection must close, and how each request ends.
///
/// A value type fed with events and the time they happened (`now`, so tests run it on a made-up
/// clock); ``HTTP2ClientHandler`` owns one, feeds it what nghttp2 and the channel report, and
/// carries out what it answers.
public struct HTTP2ConnectionStateMachine: Sendable {
    public struct Configuration: Sendable {
        /// Our own cap on concurrent streams, whatever the server allows.
        public var maxConcurrentStreams: Int
        /// Send a PING after this long without any frame from the server.
        public var idlePingInterval: TimeAmount
        /// Close the connection when a PING is not acknowledged within this time.
        public var pingTimeout: TimeAmount
        /// Fail the connection when the server's first SETTINGS do not arrive within this time.
        public var readyTimeout: TimeAmount

        public init(maxConcurrentStreams: Int, idlePingInterval: TimeAmount, pingTimeout: TimeAmount,
                    readyTimeout: TimeAmount) {
            self.maxConcurrentStreams = maxConcurrentStreams
            self.idlePingInterval = idlePingInterval
            self.pingTimeout = pingTimeout
            self.readyTimeout = readyTimeout
        }
    }

    public enum Phase: Sendable, Equatable {
        /// Waiting for the server's first SETTINGS; requests queue.
        case starting
        /// Requests flow, up to the stream limit.
        case open
        /// GOAWAY sent or received: no new streams, the open ones finish.
        case goingAway
        case closed
    }

    /// What a timer tick asks for.
    public enum TimerAction: Sendable, Equatable {
        case none
        case sendPing
        case fail(HTTP2Error)
    }

    /// What the server's SETTINGS changed.
    public struct SettingsChange: Sendable, Equatable {
        /// The first SETTINGS: the connection became ready.
        public var becameReady: Bool
        /// The stream limit after our cap, when it changed.
        public var streamLimit: Int?

        public init(becameReady: Bool, streamLimit: Int?) {
            self.becameReady = becameReady
            self.streamLimit = streamLimit
        }
    }

    /// How one request ends.
    public enum StreamEnd: Sendable, Equatable {
        /// The whole response arrived.
        case response
        /// Failed; the error says whether the server may have processed it.
        case failure(HTTP2StreamError)
    }

    public let configuration: Configuration
    public private(set) var phase: Phase = .starting
    /// SETTINGS_MAX_CONCURRENT_STREAMS as the server last sent it (1 until its first SETTINGS).
    public private(set) var serverStreamLimit = 1
    /// The lowest last-stream-id of the GOAWAYs received; streams above it were not processed.
    public private(set) var goAwayLastStreamID: Int32 = .max
    private var lastFrameReceived: NIODeadline
    private var pingSentAt: NIODeadline?

    public init(configuration: Configuration, now: NIODeadline) {
        self.configuration = configuration
        self.lastFrameReceived = now
    }

    /// How many streams may be open at once now.
    public var streamLimit: Int { min(serverStreamLimit, configuration.maxConcurrentStreams) }

    /// True while new requests are accepted (they queue until the connection is open).
    public var isAcceptingRequests: Bool { phase == .starting || phase == .open }

    /// How many of `pending` queued requests may start now, with `open` streams on the wire.
    public func streamsToStart(open: Int, pending: Int) -> Int {
        guard phase == .open else { return 0 }
        return max(0, min(pending, streamLimit - open))
    }

    /// Any frame arrived: the connection is alive (an outstanding PING counts as answered).
    public mutating func frameReceived(now: NIODeadline) {
        lastFrameReceived = now
        pingSentAt = nil
    }

    public mutating func pingAcknowledged() {
        pingSentAt = nil
    }

    /// The server sent SETTINGS advertising `maxConcurrentStreams`.
    public mutating func settingsReceived(maxConcurrentStreams: Int) -> SettingsChange {
        let previous = streamLimit
        serverStreamLimit = max(maxConcurrentStreams, 0)
        var becameReady = false
        if phase == .starting {
            phase = .open
            becameReady = true
        }
        return SettingsChange(becameReady: becameReady, streamLimit: streamLimit != previous ? streamLimit : nil)
    }

    /// The server sent GOAWAY: no new streams; queued requests are to be refused.
    public mutating func goAwayReceived(lastStreamID: Int32) {
        goAwayLastStreamID = min(goAwayLastStreamID, lastStreamID)
        if phase != .closed { phase = .goingAway }
    }

    /// We want to stop: true when a GOAWAY is to be sent and queued requests refused (false when
    /// the connection is already going away or closed).
    public mutating func shutdownRequested() -> Bool {
        guard phase == .starting || phase == .open else { return false }
        phase = .goingAway
        return true
    }

    /// True when a connection that is going away has nothing left to wait for.
    public func shouldClose(openStreams: Int, sessionAlive: Bool) -> Bool {
        phase == .goingAway && (openStreams == 0 || !sessionAlive)
    }

    /// The periodic check: the ready deadline, the idle PING and its answer.
    public mutating func timerFired(now: NIODeadline) -> TimerAction {
        switch phase {
        case .closed:
            return .none
        case .starting:
            return now - lastFrameReceived > configuration.readyTimeout ? .fail(.connectTimeout) : .none
        case .open, .goingAway:
            if let pingSentAt {
                return now - pingSentAt > configuration.pingTimeout ? .fail(.pingTimeout) : .none
            }
            guard now - lastFrameReceived > configuration.idlePingInterval else { return .none }
            pingSentAt = now
            return .sendPing
        }
    }

    /// A stream closed while the connection lives: how its request ends.
    ///
    /// - Parameters:
    ///   - complete: the response's headers and END_STREAM arrived.
    ///   - headersSent: our request's HEADERS went out (otherwise the server never saw it).
    ///   - deadlinePassed: the request's deadline is behind us (we reset it ourselves).
    public func streamClosed(_ streamID: Int32, errorCode: UInt32, complete: Bool, headersSent: Bool,
                             deadlinePassed: Bool) -> StreamEnd {
        if complete { return .response }
        if errorCode == HTTP2ErrorCode.refusedStream { return .failure(.refused("REFUSED_STREAM")) }
        if !headersSent || streamID > goAwayLastStreamID { return .failure(.refused("not processed")) }
        if deadlinePassed { return .failure(.timedOut) }
        return .failure(.reset(errorCode))
    }

    /// The connection is gone. False when it already was (nothing more to do).
    public mutating func connectionEnded() -> Bool {
        guard phase != .closed else { return false }
        phase = .closed
        return true
    }

    /// How a request still open when the connection ended (`why`) ends: refused when the server
    /// cannot have processed it, lost (outcome unknown) otherwise.
    public func streamAtConnectionEnd(_ streamID: Int32, complete: Bool, headersSent: Bool, why: String) -> StreamEnd {
        if complete { return .response }
        if !headersSent || streamID > goAwayLastStreamID { return .failure(.refused(why)) }
        return .failure(.connectionLost(why))
    }
}
