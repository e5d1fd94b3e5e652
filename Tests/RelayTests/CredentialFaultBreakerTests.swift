@testable import Relay
import Testing

/// The credential-fault breaker on a clock the test moves (epoch seconds).
@Suite("Credential fault breaker", .timeLimit(.minutes(3)))
struct CredentialFaultBreakerTests {
    @Test func aFaultStopsItsTeamForTheCoolDownThenOneIntentProbes() {
        var breaker = CredentialFaultBreaker(cooldownSeconds: 60)
        func refusal(_ team: String, _ now: Int64) -> String? { breaker.refusal(teamID: team, now: now) }
        func trip(_ team: String, _ reason: String, _ now: Int64) -> Bool { breaker.trip(teamID: team, reason: reason, now: now) }
        #expect(refusal("T", 1_000) == nil)
        #expect(trip("T", "InvalidProviderToken", 1_000))
        #expect(refusal("T", 1_000) == "CredentialFault: InvalidProviderToken")
        #expect(refusal("T", 1_059) == "CredentialFault: InvalidProviderToken")
        // Other teams go on.
        #expect(refusal("U", 1_001) == nil)
        // The cool-down passed: this one probes, the next ones wait for its answer's cool-down.
        #expect(refusal("T", 1_060) == nil)
        #expect(refusal("T", 1_060) == "CredentialFault: InvalidProviderToken")
        #expect(refusal("T", 1_119) == "CredentialFault: InvalidProviderToken")
        #expect(refusal("T", 1_120) == nil)
    }

    @Test func theProbesAnswerEndsOrRestartsTheFault() {
        var breaker = CredentialFaultBreaker(cooldownSeconds: 10)
        func refusal(_ team: String, _ now: Int64) -> String? { breaker.refusal(teamID: team, now: now) }
        func trip(_ team: String, _ reason: String, _ now: Int64) -> Bool { breaker.trip(teamID: team, reason: reason, now: now) }
        func reset(_ team: String) -> Bool { breaker.reset(teamID: team) }
        #expect(trip("T", "ExpiredProviderToken", 0))
        #expect(refusal("T", 10) == nil)
        // Refused again: not a new fault (logged once), the cool-down starts from now, the
        // newest reason is given.
        #expect(!trip("T", "BadCertificate", 12))
        #expect(refusal("T", 21) == "CredentialFault: BadCertificate")
        #expect(refusal("T", 22) == nil)
        // Accepted: the fault ends once.
        #expect(reset("T"))
        #expect(!reset("T"))
        #expect(refusal("T", 23) == nil)
        #expect(refusal("T", 23) == nil)
    }
}
