/// Where notifications go.
public struct APNsEndpoint: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public static let production = APNsEndpoint(host: "api.push.apple.com", port: 443)
    public static let development = APNsEndpoint(host: "api.sandbox.push.apple.com", port: 443)

    /// `production`, `development`, or `https://HOST[:PORT]` (IPv6 hosts in brackets).
    public init(parsing text: String) throws(APNsError) {
        switch text {
        case "production": self = .production
        case "development", "sandbox": self = .development
        default:
            guard text.hasPrefix("https://") else { throw .badEndpoint(text) }
            var rest = Substring(text.dropFirst("https://".count))
            if rest.hasSuffix("/") { rest = rest.dropLast() }
            guard let (host, port) = Self.hostAndPort(rest, defaultPort: 443) else { throw .badEndpoint(text) }
            self.init(host: host, port: port)
        }
    }

    /// `HOST[:PORT]` (IPv6 hosts in brackets), or nil when it does not read so.
    static func hostAndPort(_ text: Substring, defaultPort: Int) -> (host: String, port: Int)? {
        var host: Substring
        var port = defaultPort
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let parsed = Int(after.dropFirst()) else { return nil }
                port = parsed
            }
        } else if let colon = text.lastIndex(of: ":") {
            host = text[..<colon]
            guard let parsed = Int(text[text.index(after: colon)...]) else { return nil }
            port = parsed
        } else {
            host = text
        }
        guard !host.isEmpty, !host.contains("/"), (1...65535).contains(port) else { return nil }
        return (String(host), port)
    }

    public var description: String { "https://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
}
