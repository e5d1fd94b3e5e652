import Metrics

/// The metrics the APNs module emits; names live here only.
enum APNsMetrics {
    static let goAways = "apns_relay_apns_goaway_total"
    static let tokenMints = "apns_relay_provider_token_mints_total"
    static let readyConnections = "apns_relay_apns_connections_ready"
    static let connectAttempts = "apns_relay_apns_connect_attempts_total"
    static let tokenIssuedAt = "apns_relay_provider_token_issued_timestamp_seconds"
    static let tokenRequests = "apns_relay_provider_token_requests_total"

    /// Labels only known reasons, so a server cannot grow the label set.
    static func goAway(reason: String) {
        let known: String
        if case .unknown = APNsReason(reason) { known = reason == "none" ? "none" : "other" } else { known = reason }
        Counter(label: goAways, dimensions: [("reason", known)]).increment()
    }

    static func tokenMinted(teamID: String, keyID: String) {
        Counter(label: tokenMints, dimensions: [("team_id", teamID), ("key_id", keyID)]).increment()
    }

    /// The `iat` of the token a process uses for (team, key): its age is `time() - value`.
    static func tokenInUse(teamID: String, keyID: String, issuedAt: Int64) {
        Gauge(label: tokenIssuedAt, dimensions: [("team_id", teamID), ("key_id", keyID)]).record(issuedAt)
    }

    /// `apns_relay_provider_token_requests_total{team_id,key_id}`: sends that asked for this key's provider token (one
    /// per `APNsClient.send`, so a notification retried by the relay counts once per try). The
    /// token-age alert fires only for keys that send: an idle key mints no token and its age
    /// only grows.
    static func tokenRequests(teamID: String, keyID: String) -> Counter {
        Counter(label: tokenRequests, dimensions: [("team_id", teamID), ("key_id", keyID)])
    }

    /// Ready connections of one credential's clients (`credential`: ``APNsClientConfiguration/credentialLabel``).
    static func ready(credential: String) -> Meter {
        Meter(label: readyConnections, dimensions: [("credential", credential)])
    }

    static let attempts = Counter(label: connectAttempts)
    /// `apns_relay_apns_proxy_failures_total`: connection attempts whose HTTP proxy refused or did not
    /// answer the `CONNECT` (each retried with backoff, like any failed connection).
    static let proxyFailures = Counter(label: "apns_relay_apns_proxy_failures_total")

    /// Makes the connection series and this key's mint counter exist from the start (at 0).
    static func register(teamID: String, keyID: String) {
        Counter(label: tokenMints, dimensions: [("team_id", teamID), ("key_id", keyID)]).increment(by: 0)
        tokenRequests(teamID: teamID, keyID: keyID).increment(by: 0)
        registerConnections()
    }

    /// Makes the connection counters exist from the start (at 0), for any credential.
    static func registerConnections() {
        attempts.increment(by: 0)
        proxyFailures.increment(by: 0)
        Counter(label: goAways, dimensions: [("reason", "none")]).increment(by: 0)
    }
}
