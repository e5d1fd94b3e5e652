import Foundation

/// Where Redis is: `redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS.
public struct RedisURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var database: Int
    public var username: String?
    public var password: String?
    public var tls: Bool

    public init(host: String, port: Int = 6379, database: Int = 0, username: String? = nil,
                password: String? = nil, tls: Bool = false) {
        self.host = host
        self.port = port
        self.database = database
        self.username = username
        self.password = password
        self.tls = tls
    }

    public init(parsing text: String) throws(RedisError) {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            throw .invalidURL("expected redis://[[user]:password@]host[:port][/db]")
        }
        guard scheme == "redis" || scheme == "rediss" else {
            throw .invalidURL("scheme must be redis or rediss, got \(scheme)")
        }
        guard let host = components.host, !host.isEmpty else { throw .invalidURL("no host") }
        let port = components.port ?? 6379
        guard (1...65535).contains(port) else { throw .invalidURL("port \(port) is out of range") }
        var database = 0
        let path = components.path.trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        if !path.isEmpty {
            guard let number = Int(path), number >= 0 else { throw .invalidURL("database must be a number, got \(path)") }
            database = number
        }
        let user = components.percentEncodedUser.flatMap { $0.removingPercentEncoding }
        let password = components.percentEncodedPassword.flatMap { $0.removingPercentEncoding }
        self.init(host: host, port: port, database: database, username: user?.isEmpty == false ? user : nil,
                  password: password?.isEmpty == false ? password : nil, tls: scheme == "rediss")
    }

    /// The URL with the password replaced, for logs and `check-config`.
    public var description: String {
        var credentials = ""
        if username != nil || password != nil {
            credentials = (username ?? "") + (password != nil ? ":<redacted>" : "") + "@"
        }
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "\(tls ? "rediss" : "redis")://\(credentials)\(shownHost):\(port)/\(database)"
    }
}
