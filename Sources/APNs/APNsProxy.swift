import Foundation
import Common
import NIOExtras

/// An HTTP proxy APNs connections go through: each connection opens an HTTP `CONNECT` tunnel to
/// the APNs host, then speaks TLS (ALPN h2) end to end inside it, so the proxy sees neither
/// requests nor tokens.
public struct APNsProxy: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    /// Sent as `Proxy-Authorization: Basic` when given.
    public var username: String?
    public var password: String?
    /// Hosts reached directly, not through the proxy (see ``isUsed(for:)``).
    public var noProxy: [String]

    public init(host: String, port: Int, username: String? = nil, password: String? = nil, noProxy: [String] = []) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.noProxy = noProxy
    }

    /// `http://[user[:password]@]host[:port]` (port 80 when left out; IPv6 hosts in brackets;
    /// user and password percent-encoded where they need it: `%25` for `%`, `%40` for `@`, `%3A`
    /// for `:` in the password; a user name may not hold `:`).
    public init(parsing text: String, noProxy: [String] = []) throws(APNsError) {
        guard text.hasPrefix("http://") else { throw .badProxy(Self.redacted(text)) }
        var rest = Substring(text.dropFirst("http://".count))
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        var username: String?, password: String?
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            let parts = userInfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
            // A ":" in the user name would make the Basic credentials ambiguous (RFC 7617).
            guard let user = parts[0].removingPercentEncoding, !user.isEmpty, !user.contains(":") else {
                throw .badProxy(Self.redacted(text))
            }
            username = user
            if parts.count == 2 {
                guard let secret = parts[1].removingPercentEncoding else { throw .badProxy(Self.redacted(text)) }
                password = secret
            }
        }
        guard let (host, port) = APNsEndpoint.hostAndPort(rest, defaultPort: 80) else { throw .badProxy(Self.redacted(text)) }
        self.init(host: host, port: port, username: username, password: password, noProxy: noProxy)
    }

    /// Whether connections to `host` go through the proxy (``noProxy`` does not name it): a
    /// name matches itself and its subdomains (a leading `.` or `*.` is the same), an IP address
    /// only itself (IPv6 with or without brackets), `*` every host.
    public func isUsed(for host: String) -> Bool {
        let host = Self.normalized(host)
        let isAddress = Self.isIPAddress(host)
        return !noProxy.contains { entry in
            var entry = Self.normalized(entry)
            if entry == "*" { return true }
            if entry.hasPrefix("*.") { entry.removeFirst(2) } else if entry.hasPrefix(".") { entry.removeFirst() }
            guard !entry.isEmpty else { return false }
            return host == entry || (!isAddress && host.hasSuffix("." + entry))
        }
    }

    /// Why a `no_proxy` entry can never match, or nil when it is usable: a port, a path or a
    /// network range (CIDR) are not supported.
    public static func noProxyProblem(_ entry: String) -> String? {
        let entry = normalized(entry)
        if entry.isEmpty { return "an empty entry" }
        if entry.contains("/") { return "a network range or path: list host names or addresses" }
        if entry.contains(":"), !isIPAddress(entry) { return "a port: list host names or addresses without one" }
        if entry.dropFirst().contains("*") || (entry.hasPrefix("*") && entry != "*" && !entry.hasPrefix("*.")) {
            return "a wildcard other than a leading \"*.\" or \"*\" alone"
        }
        return nil
    }

    private static func normalized(_ text: String) -> String {
        var text = text.trimmingCharacters(in: .whitespaces).lowercased()
        if text.hasPrefix("["), text.hasSuffix("]") { text = String(text.dropFirst().dropLast()) }
        return text
    }

    /// An IPv4 address, or an IPv6 one (hex digits, dots and at least two colons).
    private static func isIPAddress(_ text: String) -> Bool {
        if text.contains(":") {
            return text.filter { $0 == ":" }.count >= 2 && text.allSatisfy { $0.isHexDigit || $0 == ":" || $0 == "." }
        }
        return !text.isEmpty && text.allSatisfy { $0.isNumber || $0 == "." }
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

    /// `text` with its credentials redacted (``URLCredentials/redacted(_:)``): whatever the
    /// text, no part of a password shows.
    public static func redacted(_ text: String) -> String { URLCredentials.redacted(text) }

    /// What went wrong with a proxy's `CONNECT`, in a line (never the error's source location).
    static func describe(_ error: NIOHTTP1ProxyConnectHandler.Error) -> String {
        let known: [(NIOHTTP1ProxyConnectHandler.Error, String)] = [
            (.proxyAuthenticationRequired(), "407 Proxy Authentication Required (check the proxy's user and password)"),
            (.httpProxyHandshakeTimeout(), "no answer to CONNECT before the connect timeout"),
            (.remoteConnectionClosed(), "the proxy closed the connection during CONNECT"),
            (.invalidProxyResponse(), "the proxy answered CONNECT with a body"),
            (.channelUnexpectedlyInactive(), "the connection closed before CONNECT was sent"),
            (.noResult(), "the tunnel was given up before the proxy answered"),
            (.droppedWrites(), "the tunnel failed with writes pending"),
        ]
        if let match = known.first(where: { $0.0 == error }) { return match.1 }
        // The remaining kind, an answer other than 2xx, carries the answer's head.
        let text = String(describing: error)
        if let range = text.range(of: "status: ") {
            return "answered CONNECT with " + text[range.upperBound...].prefix { $0 != "," && $0 != ")" }
        }
        return "the proxy refused CONNECT"
    }
}
