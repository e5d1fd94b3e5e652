import NIOCore

/// The name a TLS client sends as SNI and verifies the certificate against.
public enum TLSServerName {
    /// `host`, or nil when it is an IP address (RFC 6066 allows no address in SNI): a name that
    /// merely starts with a digit (`1password.example`, `9cache.internal`) is a name.
    public static func of(host: String) -> String? {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        return (try? SocketAddress(ipAddress: bare, port: 0)) != nil ? nil : host
    }
}
