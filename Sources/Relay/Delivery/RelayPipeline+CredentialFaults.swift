/// The credential faults the pipeline keeps (``CredentialFaultBreaker``), logged and counted.
extension RelayPipeline {
    func activeCredentialFault(teamID: String, now: Int64) -> String? {
        state.withLock { $0.credentialFaults.refusal(teamID: teamID, now: now) }
    }

    func recordCredentialFault(teamID: String, reason: String, now: Int64) {
        let isNew = state.withLock { $0.credentialFaults.trip(teamID: teamID, reason: reason, now: now) }
        RelayMetrics.credentialFault(teamID: teamID)
        if isNew {
            logger.critical("APNs refused the credentials: sends for this team stop", metadata: [
                "apns.team_id": "\(teamID)", "apns.reason": "\(reason)",
                "relay.cooldown_s": "\(configuration.retry.credentialFaultCooldownSeconds)",
            ])
        }
    }

    func clearCredentialFault(teamID: String) {
        let cleared = state.withLock { $0.credentialFaults.reset(teamID: teamID) }
        if cleared { logger.warning("APNs accepts the credentials again", metadata: ["apns.team_id": "\(teamID)"]) }
    }
}
