import Metrics

/// The metrics the APNs module emits; names live here only.
enum APNsMetrics {
    static let goAways = "apns_goaway_total"
    static let tokenMints = "apns_jwt_mints_total"
    static let readyConnections = "apns_connections_ready"
    static let connectAttempts = "apns_connect_attempts_total"

    /// Labels only known reasons, so a server cannot grow the label set.
    static func goAway(reason: String) {
        let known: String
        if case .unknown = APNsReason(reason) { known = reason == "none" ? "none" : "other" } else { known = reason }
        Counter(label: goAways, dimensions: [("reason", known)]).increment()
    }

    static func tokenMinted(teamID: String, keyID: String) {
        Counter(label: tokenMints, dimensions: [("team_id", teamID), ("key_id", keyID)]).increment()
    }

    static let ready = Meter(label: readyConnections)
    static let attempts = Counter(label: connectAttempts)
}
