import Logging

/// Which teams' credentials APNs refused (403 with a credential reason), as a pure state
/// machine on an injected clock (epoch seconds).
///
/// A fault stops sends for its team for `cooldownSeconds`; once that passed, the first intent
/// asking probes (it is sent) and the team's cool-down starts again for the ones after it, until
/// the probe's answer either trips the breaker again or resets it.
struct CredentialFaultBreaker: Sendable {
    let cooldownSeconds: Int64
    private var faults: [String: (until: Int64, reason: String)] = [:]

    init(cooldownSeconds: Int64) {
        self.cooldownSeconds = cooldownSeconds
    }

    /// Why an intent of `teamID` may not be sent at `now`, or nil when it may (no fault, or it
    /// is the probe after a cool-down).
    mutating func refusal(teamID: String, now: Int64) -> String? {
        guard let fault = faults[teamID] else { return nil }
        if now >= fault.until {
            // Let this one intent probe; the next ones wait for its answer's cool-down.
            faults[teamID] = (now + cooldownSeconds, fault.reason)
            return nil
        }
        return "CredentialFault: \(fault.reason)"
    }

    /// APNs refused `teamID`'s credentials at `now`: its cool-down starts (again). True when the
    /// team was not in a fault before.
    mutating func trip(teamID: String, reason: String, now: Int64) -> Bool {
        defer { faults[teamID] = (now + cooldownSeconds, reason) }
        return faults[teamID] == nil
    }

    /// APNs accepted a notification of `teamID`. True when that ended a fault.
    mutating func reset(teamID: String) -> Bool {
        faults.removeValue(forKey: teamID) != nil
    }
}

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
