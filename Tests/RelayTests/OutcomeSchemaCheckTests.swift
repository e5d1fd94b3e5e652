import Testing
import TestSupport

/// The schema check every end-to-end test's outcomes go through (``OutcomeLog``) refuses what
/// the schema refuses.
@Suite("Outcome schema check", .timeLimit(.minutes(1)))
struct OutcomeSchemaCheckTests {
    static let valid = #"""
    {"v":1,"id":"a-1","token":"ab","channel_id":null,"topic":"com.example.app","status":"delivered","original_status":null,"http_status":200,
     "reason":null,"apns_id":"5E4C7A9F-7E6B-4B3A-9C1D-2F8E6A5B4C3D","apns_unique_id":null,"unregistered_at":null,"badge":null,"superseded_by":null,
     "attempts":1,"latency_ms":3,"lane":"apns.intents","partition":0,"offset":7,"worker":"w","at":1700000000000}
    """#

    func problems(_ text: String) throws -> [String] {
        try JSONSchemaCheck(docs: "outcome.schema.json").problems(JSONValue(parsing: Array(text.utf8)))
    }

    func changed(_ member: String, to value: String) -> String {
        Self.valid.replacing(try! Regex(#""\#(member)":[^,]*,"#), with: #""\#(member)":\#(value),"#)
    }

    @Test func aValidOutcomePasses() throws {
        #expect(try problems(Self.valid) == [])
    }

    @Test(arguments: [
        ("status", #""sent""#, "is not one of"),
        ("v", "2", "is not 1"),
        ("offset", "-1", "< 0"),
        ("attempts", "true", "is not of type integer"),
        ("apns_id", #""not-a-uuid""#, "is not a UUID"),
        ("http_status", #""200""#, "is none of the types"),
        ("original_status", #""duplicate""#, "is not one of"),
        ("lane", "null", "is not of type string"),
    ])
    func aWrongMemberIsNamed(member: String, value: String, problem: String) throws {
        let found = try problems(changed(member, to: value))
        #expect(found.count == 1 && found[0].hasPrefix("$.\(member): ") && found[0].contains(problem), "\(found)")
    }

    @Test func aMissingOrAnExtraMemberIsNamed() throws {
        #expect(try problems(Self.valid.replacing(#""worker":"w","#, with: "")) == [#"$: no "worker""#])
        #expect(try problems(Self.valid.replacing(#""v":1,"#, with: #""v":1,"colour":"x","#)) == [#"$: "colour" is not allowed"#])
        #expect(try problems("[]") == ["$: [] is not of type object"])
    }

    /// The exactly-one check fails on an intent answered twice, an intent without an outcome
    /// and an outcome for no intent on the topic.
    @Test func theExactlyOneCheckFailsOnEachWayItCanBeWrong() {
        func log(_ counts: [(Int, Int, Int)]) -> OutcomeLog {
            OutcomeLog(outcomes: [], byIntent: Dictionary(uniqueKeysWithValues: counts.map {
                (OutcomeLog.IntentPosition(partition: $0.0, offset: $0.1), $0.2)
            }))
        }
        let intents = [0: 2, 1: 1]
        log([(0, 0, 1), (0, 1, 1), (1, 0, 1)]).expectOneEach(of: intents)
        log([(0, 0, 1), (1, 0, 1)]).expectOneEach(of: intents, unanswered: 1)
        withKnownIssue("answered twice") { log([(0, 0, 1), (0, 1, 2), (1, 0, 1)]).expectOneEach(of: intents) }
        withKnownIssue("unanswered") { log([(0, 0, 1), (1, 0, 1)]).expectOneEach(of: intents) }
        withKnownIssue("for no intent") { log([(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]).expectOneEach(of: intents) }
        #expect(log([(0, 0, 3), (1, 0, 1)]).repeats == 2)
        // Repeats allowed only with a given status.
        func answers(_ statuses: [String]) -> OutcomeLog {
            OutcomeLog(outcomes: statuses.map { ["partition": 0, "offset": 0, "status": $0] },
                       byIntent: [OutcomeLog.IntentPosition(partition: 0, offset: 0): statuses.count])
        }
        answers(["delivered", "duplicate"]).expectOneEach(of: [0: 1], repeatedOnlyAs: "duplicate")
        withKnownIssue("repeated as delivered") { answers(["delivered", "delivered"]).expectOneEach(of: [0: 1], repeatedOnlyAs: "duplicate") }
    }
}
