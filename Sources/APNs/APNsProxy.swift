import Foundation

/// An HTTP proxy APNs connections go through: each connection opens an HTTP `CONNECT` tunnel to
/// the APNs host, then speaks TLS (ALPN h2) end to end inside it, so the proxy sees neither
/// requests nor tokens.
public struct APNsProxy: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    /// Sent as `Proxy-Authorization: Basic` when given.
    public var username: String?
    public var password: String?
    /// Hosts reached directly, not through the proxy: a name matches itself and its subdomains
    /// (`push.apple.com` matches `api.push.apple.com`; a leading `.` is the same); `*` matches
    /// every host.
    public var noProxy: [String]

    public init(host: String, port: Int, username: String? = nil, password: String? = nil, noProxy: [String] = []) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.noProxy = noProxy
    }

    /// `http://[user[:password]@]host[:port]` (port 80 when left out; IPv6 hosts in brackets;
    /// user and password percent-encoded where they need it).
    public init(parsing text: String, noProxy: [String] = []) throws(APNsError) {
        guard text.hasPrefix("http://") else { throw .badProxy(Self.redacted(text)) }
        var rest = Substring(text.dropFirst("http://".count))
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        var username: String?, password: String?
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            let parts = userInfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
            guard let user = parts[0].removingPercentEncoding, !user.isEmpty else { throw .badProxy(Self.redacted(text)) }
            username = user
            if parts.count == 2 {
                guard let secret = parts[1].removingPercentEncoding else { throw .badProxy(Self.redacted(text)) }
                password = secret
            }
        }
        guard let (host, port) = APNsEndpoint.hostAndPort(rest, defaultPort: 80) else { throw .badProxy(Self.redacted(text)) }
        self.init(host: host, port: port, username: username, password: password, noProxy: noProxy)
    }

    /// Whether connections to `host` go through the proxy (``noProxy`` does not name it).
    public func isUsed(for host: String) -> Bool {
        let host = host.lowercased()
        return !noProxy.contains { entry in
            var entry = entry.lowercased()
            if entry == "*" { return true }
            if entry.hasPrefix(".") { entry.removeFirst() }
            return !entry.isEmpty && (host == entry || host.hasSuffix("." + entry))
        }
    }

    /// `Proxy-Authorization` for the `CONNECT`, when credentials are given.
    var authorization: String? {
        guard let username else { return nil }
        return "Basic " + Data("\(username):\(password ?? "")".utf8).base64EncodedString()
    }

    /// The proxy's URL with any password redacted (logs, errors, `check-config`).
    public var description: String {
        let shownHost = host.contains(":") ? "[\(host)]" : host
        let user = username.map { "\($0)\(password == nil ? "" : ":<redacted>")@" } ?? ""
        return "http://\(user)\(shownHost):\(port)"
    }

    /// `text` with whatever stands between `:` and `@` of its user part redacted.
    public static func redacted(_ text: String) -> String {
        text.replacingOccurrences(of: #"(//[^:/@]*:)[^@]*@"#, with: "$1<redacted>@", options: .regularExpression)
    }
}
