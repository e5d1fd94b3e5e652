@testable import Relay
import Testing

/// The pure part of a batch's admission, step by step: no Redis, no clock.
@Suite("Batch admission", .timeLimit(.minutes(3)))
struct BatchAdmissionTests {
    static let a = String(repeating: "aa", count: 32)
    static let b = String(repeating: "bb", count: 32)

    static func intent(_ id: String, token: String = a, topic: String = "com.x", collapse: String? = nil,
                       expiration: Int64? = nil) -> Result<Intent, InvalidIntent> {
        var fields = [#""id":"\#(id)""#, #""token":"\#(token)""#, #""topic":"\#(topic)""#, #""payload":{"aps":{}}"#]
        if let collapse { fields.append(#""collapse_id":"\#(collapse)""#) }
        if let expiration { fields.append(#""expiration":\#(expiration)"#) }
        return IntentTests.parse("{" + fields.joined(separator: ",") + "}")
    }

    static func rules(coalesce: Bool = true) -> (String) -> RelayConfiguration.Policy.Rules {
        { _ in
            var rules = RelayConfiguration.Policy.Rules()
            rules.coalesce = coalesce
            return rules
        }
    }

    @Test func groupsByDeviceAndTopicInBatchOrderAndSkipsInvalidOnes() {
        let parsed = [Self.intent("1"), Self.intent("2", token: Self.b), .failure(InvalidIntent(reason: "x", message: "y", id: "bad")),
                      Self.intent("3"), Self.intent("4", topic: "com.y")]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        var groups: [DevicePolicy.Group] = [], members: [[Int]] = []
        BatchAdmission.group(parsed, rules: Self.rules(), admissions: &admissions, groups: &groups, members: &members)
        #expect(groups.map(\.token) == [Self.a, Self.b, Self.a])
        #expect(groups.map(\.topic) == ["com.x", "com.x", "com.y"])
        #expect(groups.map(\.ids) == [["1", "3"], ["2"], ["4"]])
        #expect(members == [[0, 3], [1], [4]])
        #expect(admissions == Array(repeating: .send, count: parsed.count))
    }

    @Test func collapsesToTheNewestOfACollapseIDWhereTheTopicCoalesces() {
        let parsed = [Self.intent("1", collapse: "c"), Self.intent("2", collapse: "c"), Self.intent("3", collapse: "d"),
                      Self.intent("4", collapse: "c"), Self.intent("5", token: Self.b, collapse: "c")]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        var groups: [DevicePolicy.Group] = [], members: [[Int]] = []
        BatchAdmission.group(parsed, rules: Self.rules(), admissions: &admissions, groups: &groups, members: &members)
        #expect(admissions == [.coalesced(by: "4"), .coalesced(by: "4"), .send, .send, .send])
        #expect(groups.map(\.ids) == [["3", "4"], ["5"]])
        #expect(members == [[2, 3], [4]])

        // Without coalescing every intent is asked about.
        admissions = Array(repeating: .send, count: parsed.count)
        groups = []
        members = []
        BatchAdmission.group(parsed, rules: Self.rules(coalesce: false), admissions: &admissions, groups: &groups, members: &members)
        #expect(admissions == Array(repeating: .send, count: parsed.count))
        #expect(groups.map(\.ids) == [["1", "2", "3", "4"], ["5"]])
    }

    @Test func ofTheIntentsThatMustWaitTheNewestIsParkedAndTheOlderAreCoalescedByIt() {
        let parsed = [Self.intent("1"), Self.intent("2"), Self.intent("3"), Self.intent("4"), Self.intent("5")]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        let record = AnswerRecord(status: "unregistered", httpStatus: 410, unregisteredAt: 1_432_819_882_000, reason: "Unregistered")
        BatchAdmission.apply((decisions: [.send, .duplicate(record), .wait, .inMailbox, .wait], due: 42), to: [0, 1, 2, 3, 4], parsed, &admissions)
        #expect(admissions == [.send, .duplicate(record), .coalesced(by: "5"), .inMailbox, .park(due: 42)])
    }

    @Test func aNowOrNeverIntentThatMustWaitExpiresInsteadOfBeingParked() {
        let parsed = [Self.intent("1"), Self.intent("2", expiration: 0)]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        BatchAdmission.apply((decisions: [.wait, .wait], due: 7), to: [0, 1], parsed, &admissions)
        #expect(admissions == [.park(due: 7), .nowOrNever])
    }

    @Test func aCopyOfTheIntentBeingParkedIsADuplicateOfIt() {
        let parsed = [Self.intent("same"), Self.intent("other"), Self.intent("same")]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        BatchAdmission.apply((decisions: [.wait, .wait, .wait], due: 1), to: [0, 1, 2], parsed, &admissions)
        #expect(admissions == [.duplicate(nil), .coalesced(by: "same"), .park(due: 1)])
    }

    @Test func answersApplyOnlyToTheirGroupsPositions() {
        let parsed = [Self.intent("1"), Self.intent("2", token: Self.b), Self.intent("3")]
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        BatchAdmission.apply((decisions: [.wait, .wait], due: 9), to: [0, 2], parsed, &admissions)
        #expect(admissions == [.coalesced(by: "3"), .send, .park(due: 9)])
    }
}
