import Metrics

/// The metrics the relay emits; names live here only (docs/operations.md and dashboards read
/// them from here).
enum RelayMetrics {
    static let intentsConsumed = Counter(label: "relay_intents_consumed_total")
    static let retries = Counter(label: "relay_retries_total")
    static let redisErrors = Counter(label: "relay_redis_errors_total")
    static let inFlight = Gauge(label: "relay_in_flight")
    static let apnsLatency = Timer(label: "relay_apns_request_duration_seconds", preferredDisplayUnit: .seconds)

    /// Outcomes by status and reason code (the part before any ":" detail, so the label set
    /// stays small).
    static func outcome(_ outcome: Outcome) {
        let reason = outcome.reason.map { String($0.prefix { $0 != ":" }) } ?? "none"
        Counter(label: "relay_outcomes_total", dimensions: [("status", outcome.status.rawValue), ("reason", reason)]).increment()
    }

    static func consumerLag(partition: Int32, records: Int64) {
        Gauge(label: "relay_consumer_lag", dimensions: [("partition", String(partition))]).record(records)
    }

    static func credentialFault(teamID: String) {
        Counter(label: "relay_credential_faults_total", dimensions: [("team_id", teamID)]).increment()
    }
}
