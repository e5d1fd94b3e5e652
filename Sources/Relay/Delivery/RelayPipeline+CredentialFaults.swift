/// The credential faults the pipeline keeps (``CredentialFaultBreaker``), logged and counted.
extension RelayPipeline {
    func activeCredentialFault(teamID: String, now: Int64) -> String? {
        credentialFaults.withLock { $0.refusal(teamID: teamID, now: now) }
    }

    func recordCredentialFault(teamID: String, reason: String, now: Int64) {
        let isNew = credentialFaults.withLock { $0.trip(teamID: teamID, reason: reason, now: now) }
        RelayMetrics.credentialFault(teamID: teamID)
        if isNew {
            logger.critical("APNs refused the credentials: sends for this team stop", metadata: [
                "apns.team_id": "\(teamID)", "apns.reason": "\(reason)",
                "relay.cooldown_s": "\(configuration.retry.credentialFaultCooldownSeconds)",
            ])
        }
    }

    func clearCredentialFault(teamID: String) {
        let cleared = credentialFaults.withLock { $0.reset(teamID: teamID) }
        if cleared { logger.warning("APNs accepts the credentials again", metadata: ["apns.team_id": "\(teamID)"]) }
    }
}
