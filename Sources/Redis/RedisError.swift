/// Why a Redis call failed. Descriptions never include the password.
public enum RedisError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The URL is not `redis://[[user]:password@]host[:port][/db]` (or `rediss://`).
    case invalidURL(String)
    /// No connection could be made (refused, unreachable, TLS failure, AUTH or SELECT refused).
    case unavailable(String)
    /// The connection ended before the answer.
    case connectionLost(String)
    /// No answer before the call's deadline; the connection is closed and made again.
    case timedOut
    /// Redis sent something that is not RESP.
    case protocolError(String)
    /// An error reply (`-ERR ...`) where a value was needed.
    case server(String)
    /// The client was shut down.
    case shutdown

    /// An error reply that refuses the command for what it names (a script failing on a value
    /// it read, a key of another type): asked again, Redis answers the same. Unlike a Redis that
    /// is down, loading, out of memory or read-only (`LOADING`, `OOM`, `READONLY`, ...).
    public var isRefusal: Bool {
        guard case .server(let message) = self else { return false }
        let code = message.prefix { $0 != " " }
        return code == "ERR" || code == "WRONGTYPE"
    }

    public var description: String {
        switch self {
        case .invalidURL(let why): "invalid Redis URL: \(why)"
        case .unavailable(let why): "Redis unavailable: \(why)"
        case .connectionLost(let why): "Redis connection lost: \(why)"
        case .timedOut: "Redis did not answer before the deadline"
        case .protocolError(let why): "Redis protocol error: \(why)"
        case .server(let message): "Redis error: \(message)"
        case .shutdown: "Redis client shut down"
        }
    }
}
