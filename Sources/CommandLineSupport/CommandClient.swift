public import APNs
import Foundation

extension APNsClientConfiguration {
    /// What `send` and `channels` connect with: one connection, `timeout` seconds to connect
    /// and for the answer, TLS verification unless `insecure` (said on stderr), and the proxy of
    /// `--proxy`, else `$APNS_RELAY_APNS_PROXY` (with `$APNS_RELAY_APNS_NO_PROXY`).
    public static func forCommand(endpoint: APNsEndpoint, credential: APNsCredential, timeout: Int, insecure: Bool,
                                  proxy: String?) throws(APNsError) -> APNsClientConfiguration {
        var configuration = APNsClientConfiguration(endpoint: endpoint, credential: credential)
        configuration.connections = 1
        configuration.requestTimeout = .seconds(Int64(timeout))
        configuration.connectTimeout = .seconds(Int64(timeout))
        configuration.insecureSkipVerify = insecure
        let environment = ProcessInfo.processInfo.environment
        if let proxy = proxy ?? environment["APNS_RELAY_APNS_PROXY"], !proxy.isEmpty {
            let noProxy = (environment["APNS_RELAY_APNS_NO_PROXY"] ?? "").split(separator: ",")
                .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            configuration.proxy = try APNsProxy(parsing: proxy, noProxy: noProxy)
        }
        if insecure { Terminal.error("warning: --insecure: the server's TLS certificate is not verified") }
        return configuration
    }
}
