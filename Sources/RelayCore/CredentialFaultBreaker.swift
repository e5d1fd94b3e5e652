/// Which teams' credentials APNs refused (403 with a credential reason), as a pure state
/// machine on an injected clock (epoch seconds).
///
/// A fault stops sends for its team for `cooldownSeconds`; once that passed, the first intent
/// asking probes (it is sent) and the team's cool-down starts again for the ones after it, until
/// the probe's answer either trips the breaker again or resets it.
package struct CredentialFaultBreaker: Sendable {
    package let cooldownSeconds: Int64
    private var faults: [String: (until: Int64, reason: String)] = [:]

    package init(cooldownSeconds: Int64) {
        self.cooldownSeconds = cooldownSeconds
    }

    /// Why an intent of `teamID` may not be sent at `now`, or nil when it may (no fault, or it
    /// is the probe after a cool-down).
    package mutating func refusal(teamID: String, now: Int64) -> String? {
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
    package mutating func trip(teamID: String, reason: String, now: Int64) -> Bool {
        defer { faults[teamID] = (now + cooldownSeconds, reason) }
        return faults[teamID] == nil
    }

    /// APNs accepted a notification of `teamID`. True when that ended a fault.
    package mutating func reset(teamID: String) -> Bool {
        faults.removeValue(forKey: teamID) != nil
    }
}
