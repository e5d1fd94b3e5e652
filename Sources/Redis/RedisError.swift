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
    /// is down, loading, out of memory, read-only, busy or moving a slot (`LOADING`, `OOM`,
    /// `READONLY`, `MASTERDOWN`, `BUSY`, `TRYAGAIN`, ...): those are outages, waited out, also
    /// when Redis reports them from inside a script (``code``).
    public var isRefusal: Bool {
        guard case .server(let message) = self, let code = Self.code(of: message) else { return false }
        switch code {
        case "WRONGTYPE": return true
        // `ERR` is also what Redis answers when it cannot take a client: that passes.
        case "ERR": return !message.hasPrefix("ERR max number of clients reached")
        default: return false
        }
    }

    /// The code of an error reply: the word that says what happened (`READONLY`, `OOM`, `ERR`,
    /// ...). An error raised inside a script names the failing command's code first on Redis 7
    /// (`READONLY You can't write ... script: ...`); Redis 6.2 and older wrap it in `ERR`
    /// (`ERR Error running script (call to f_...): @user_script:3: @user_script: 3: -READONLY
    /// You can't write ...`): then the inner code counts. Nil when the reply has no code.
    public static func code(of message: String) -> Substring? {
        let first = message.prefix { $0 != " " }
        guard Self.isCode(first) else { return nil }
        guard first == "ERR", message.hasPrefix("ERR Error running script") || message.contains("@user_script") else {
            return first
        }
        // The inner reply, as Redis printed it after the script's position: ": -CODE text".
        var rest = message[...]
        while let dash = rest.range(of: ": -") {
            let candidate = rest[dash.upperBound...].prefix { $0 != " " }
            if Self.isCode(candidate) { return candidate }
            rest = rest[dash.upperBound...]
        }
        return first
    }

    /// Redis error codes are upper-case words (`ERR`, `WRONGTYPE`, `NOREPLICAS`, ...).
    private static func isCode(_ word: Substring) -> Bool {
        word.count >= 2 && word.utf8.allSatisfy { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) }
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
