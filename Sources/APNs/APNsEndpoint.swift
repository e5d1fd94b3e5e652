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
            var host: Substring
            var port = 443
            if rest.hasPrefix("[") {
                guard let close = rest.firstIndex(of: "]") else { throw .badEndpoint(text) }
                host = rest[rest.index(after: rest.startIndex)..<close]
                let after = rest[rest.index(after: close)...]
                if !after.isEmpty {
                    guard after.hasPrefix(":"), let parsed = Int(after.dropFirst()) else { throw .badEndpoint(text) }
                    port = parsed
                }
            } else if let colon = rest.lastIndex(of: ":") {
                host = rest[..<colon]
                guard let parsed = Int(rest[rest.index(after: colon)...]) else { throw .badEndpoint(text) }
                port = parsed
            } else {
                host = rest
            }
            guard !host.isEmpty, !host.contains("/"), (1...65535).contains(port) else { throw .badEndpoint(text) }
            self.init(host: String(host), port: port)
        }
    }

    public var description: String { "https://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
}
