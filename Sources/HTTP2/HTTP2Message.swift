public import NIOCore

/// An ordered list of HTTP/2 header fields, names in lower case as HTTP/2 requires.
public struct HTTP2Headers: Sendable, ExpressibleByDictionaryLiteral {
    /// The fields in order. A field's value may be changed in place; inserting, removing or
    /// reordering fields after ``addUnindexed(_:_:)`` moves its mark onto another position.
    public var fields: [(name: String, value: String)]
    /// The positions in ``fields`` (below 64) of the fields HPACK sends as literals never
    /// indexed (RFC 7541 §6.2.3), kept out of the compression contexts' dynamic tables: a value
    /// sent once (a request id) would otherwise be inserted on both ends — an allocation each,
    /// and an eviction of an entry the next requests would have referred to by index. Set by
    /// ``addUnindexed(_:_:)``; a bit per position, so marking one allocates nothing.
    public private(set) var unindexedPositions: UInt64 = 0

    public init(_ fields: [(name: String, value: String)] = []) {
        self.fields = fields
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        self.fields = elements.map { (name: $0.0, value: $0.1) }
    }

    public mutating func add(_ name: String, _ value: String) {
        fields.append((name: name, value: value))
    }

    /// Adds a field whose value no other header list repeats, kept out of HPACK's dynamic
    /// tables (``unindexedPositions``; from the 65th field on, indexed as any other).
    public mutating func addUnindexed(_ name: String, _ value: String) {
        if fields.count < 64 { unindexedPositions |= 1 << UInt64(fields.count) }
        fields.append((name: name, value: value))
    }

    /// Whether the field at `position` may be indexed (``unindexedPositions``).
    func isIndexed(at position: Int) -> Bool {
        position >= 64 || unindexedPositions & (1 << UInt64(position)) == 0
    }

    /// The first value of `name`.
    public subscript(_ name: String) -> String? {
        for field in fields where field.name == name { return field.value }
        return nil
    }

    /// How many times `name` appears.
    public func count(of name: String) -> Int {
        fields.reduce(0) { $0 + ($1.name == name ? 1 : 0) }
    }
}

/// A request as the client sends it or the server receives it. `headers` holds the regular
/// fields; the pseudo-header fields have their own properties.
public struct HTTP2Request: Sendable {
    public var method: String
    public var scheme: String
    public var authority: String
    public var path: String
    public var headers: HTTP2Headers
    public var body: ByteBuffer?
    /// Among requests waiting for a stream on one connection, higher ones start first (0–3;
    /// equal ones in order). Not sent: HTTP/2's own priority signals are left alone.
    public var precedence: Int = 0

    public init(method: String = "POST", scheme: String = "https", authority: String, path: String,
                headers: HTTP2Headers = HTTP2Headers(), body: ByteBuffer? = nil) {
        self.method = method
        self.scheme = scheme
        self.authority = authority
        self.path = path
        self.headers = headers
        self.body = body
    }
}

public struct HTTP2Response: Sendable {
    public var status: Int
    public var headers: HTTP2Headers
    public var body: ByteBuffer?

    public init(status: Int, headers: HTTP2Headers = HTTP2Headers(), body: ByteBuffer? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// Connection-level failures.
public enum HTTP2Error: Error, Sendable, Equatable, CustomStringConvertible {
    /// TLS succeeded but the peer did not agree to speak `h2` through ALPN.
    case alpnNotNegotiated(String?)
    /// The peer sent bytes that are not valid HTTP/2 (or nghttp2 refused an operation).
    case protocolViolation(String)
    /// A PING went unanswered within the deadline.
    case pingTimeout
    /// The connection was not ready within the deadline.
    case connectTimeout
    /// The connection closed; the text says why when known.
    case closed(String)

    public var description: String {
        switch self {
        case .alpnNotNegotiated(let got):
            "peer did not negotiate HTTP/2 through ALPN (got \(got.map { "'\($0)'" } ?? "no protocol")); is it an HTTP/2 server?"
        case .protocolViolation(let detail): "HTTP/2 protocol error: \(detail)"
        case .pingTimeout: "peer stopped answering: PING not acknowledged in time"
        case .connectTimeout: "connection not ready in time"
        case .closed(let why): "connection closed: \(why)"
        }
    }
}

/// Why one request got no response.
public enum HTTP2StreamError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The peer did not process the request (never sent, REFUSED_STREAM, or above a GOAWAY's
    /// last-stream-id): it is safe to send again, on another connection.
    case refused(String)
    /// The connection ended after the request was sent and before its response: the peer may or
    /// may not have processed it.
    case connectionLost(String)
    /// The peer reset the stream with this HTTP/2 error code.
    case reset(UInt32)
    /// No response before the request's deadline; the stream was cancelled.
    case timedOut
    /// The response body grew past the limit; the stream was cancelled.
    case responseTooLarge(limit: Int)

    public var description: String {
        switch self {
        case .refused(let why): "not processed by the peer (\(why))"
        case .connectionLost(let why): "connection lost before the response (\(why))"
        case .reset(let code): "stream reset by the peer (HTTP/2 error code \(code))"
        case .timedOut: "no response before the deadline"
        case .responseTooLarge(let limit): "response body larger than \(limit) bytes"
        }
    }
}
