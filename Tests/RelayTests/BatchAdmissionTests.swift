import Kafka
@testable import Relay
import Testing

extension BatchAdmission {
    /// ``apply(_:to:_:_:forgetsUnregistered:)`` for an answer whose deliveries delete no remembered 410.
    static func apply(_ answer: (decisions: [DeviceAdmission.Admission], due: Int64), to positions: [Int],
                      _ parsed: [Result<Intent, InvalidIntent>], _ admissions: inout [Admission]) {
        var forgets = Array(repeating: true, count: admissions.count)
        apply(DeviceAdmission.Decided(decisions: answer.decisions, due: answer.due, forgetsUnregistered: false), to: positions, parsed,
              &admissions, forgetsUnregistered: &forgets)
    }
}

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

    static func rules(coalesce: Bool = true) -> (String, String) -> RelayConfiguration.Policy.Rules {
        { _, _ in
            var rules = RelayConfiguration.Policy.Rules()
            rules.coalesce = coalesce
            return rules
        }
    }

    /// An intent to send queued behind one of its device and app that parked parks too, due no
    /// earlier; a now-or-never one ends `expired` instead (it cannot wait); a mailbox delivery
    /// and an answer from a record stay as they are.
    @Test func whatQueuesBehindAParkedIntentBecomes() {
        let partition = TopicPartition(topic: "t", partition: 0)
        func item(_ parsed: Result<Intent, InvalidIntent>, admission: RelayPipeline.Admission = .send, member: String? = nil) -> RelayPipeline.WorkItem {
            RelayPipeline.WorkItem(partition: partition, offset: 1, generation: 0, consumedAt: .now, intent: parsed, admission: admission,
                                   mailboxMember: member)
        }
        #expect(DeviceQueues<RelayPipeline.WorkItem>.parkingBehind(item(Self.intent("1")), due: 42)?.admission == .park(due: 42))
        #expect(DeviceQueues<RelayPipeline.WorkItem>.parkingBehind(item(Self.intent("2", expiration: 0)), due: 42)?.admission == .nowOrNever)
        #expect(DeviceQueues<RelayPipeline.WorkItem>.parkingBehind(item(Self.intent("3"), member: "m"), due: 42) == nil)
        #expect(DeviceQueues<RelayPipeline.WorkItem>.parkingBehind(item(Self.intent("4"), admission: .duplicate(nil)), due: 42) == nil)
    }

    @Test func groupsByDeviceAndTopicInBatchOrderAndSkipsInvalidOnes() {
        let parsed = [Self.intent("1"), Self.intent("2", token: Self.b), .failure(InvalidIntent(reason: "x", message: "y", id: "bad")),
                      Self.intent("3"), Self.intent("4", topic: "com.y", expiration: 0)]
        var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
        BatchAdmission.group(parsed, rules: Self.rules(), groups: &groups, members: &members)
        #expect(groups.map(\.token) == [Self.a, Self.b, Self.a])
        #expect(groups.map(\.topic) == ["com.x", "com.x", "com.y"])
        #expect(groups.map(\.ids) == [["1", "3"], ["2"], ["4"]])
        #expect(groups.map { $0.entries.map(\.nowOrNever) } == [[false, false], [false], [true]])
        #expect(groups.map(\.collapsesInto) == [[nil, nil], [nil], [nil]])
        #expect(members == [[0, 3], [1], [4]])
    }

    @Test func marksTheOlderIntentsOfACollapseIDWhereTheTopicCoalesces() {
        let parsed = [Self.intent("1", collapse: "c"), Self.intent("2", collapse: "c"), Self.intent("3", collapse: "d"),
                      Self.intent("4", collapse: "c"), Self.intent("5", token: Self.b, collapse: "c")]
        var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
        BatchAdmission.group(parsed, rules: Self.rules(), groups: &groups, members: &members)
        #expect(groups.map(\.ids) == [["1", "2", "3", "4"], ["5"]])
        #expect(groups.map(\.collapsesInto) == [[3, 3, nil, nil], [nil]])
        #expect(members == [[0, 1, 2, 3], [4]])

        // Without coalescing nothing collapses.
        groups = []
        members = []
        BatchAdmission.group(parsed, rules: Self.rules(coalesce: false), groups: &groups, members: &members)
        #expect(groups.map(\.collapsesInto) == [[nil, nil, nil, nil], [nil]])
    }

    /// A batch's admissions from group to Redis' answer: `records` by id, a bucket with `tokens`
    /// left, and what the mailbox holds (a `waiting` value); and how many tokens were spent.
    static func admit(_ parsed: [Result<Intent, InvalidIntent>], records: [String: AnswerRecord?] = [:], tokens: Int,
                      waiting: String? = nil) -> (admissions: [BatchAdmission.Admission], spent: Int) {
        var admissions = Array(repeating: BatchAdmission.Admission.send, count: parsed.count)
        var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
        BatchAdmission.group(parsed, rules: Self.rules(), groups: &groups, members: &members)
        var spent = 0
        for (group, positions) in zip(groups, members) {
            let limit = RelayConfiguration.Policy.RateLimit(burst: 10, refillPerSecond: 0.5)
            let now: Int64 = 1_000_000, interval = limit.intervalMilliseconds
            // A bucket of burst 10 with `tokens` left: its arrival time 10 - tokens intervals on.
            var bucket = DeviceAdmission.Bucket(limit, stored: now + Int64(10 - tokens) * interval, now: now)
            let decisions = DeviceAdmission.decide(group, waiting: waiting.map { Array($0.utf8) }, backoffUntil: 0, bucket: &bucket,
                                                now: now) { records[group.ids[$0]] }
            spent += bucket.spent.map { Int(($0 - now) / interval) - (10 - tokens) } ?? 0
            BatchAdmission.apply((decisions, due: 42), to: positions, parsed, &admissions)
        }
        return (admissions, spent)
    }

    @Test func aCollapseSendsItsNewestAndSpendsOneToken() {
        let parsed = [Self.intent("1", collapse: "c"), Self.intent("2", collapse: "c"), Self.intent("3"), Self.intent("4", collapse: "c")]
        let (admissions, spent) = Self.admit(parsed, tokens: 5)
        #expect(admissions == [.coalesced(by: "4"), .coalesced(by: "4"), .send, .send])
        #expect(spent == 2)
    }

    /// Review 2.5: the newest of a collapse id that cannot go out (now-or-never with no token,
    /// or refused by APNs before) does not take the older ones down with it.
    @Test func aCollapseSettlesOnTheNewestIntentThatCanStillBeDelivered() {
        let lasting = [Self.intent("1", collapse: "c"), Self.intent("2", collapse: "c"), Self.intent("3", collapse: "c", expiration: 0)]
        #expect(Self.admit(lasting, tokens: 0).admissions == [.coalesced(by: "2"), .park(due: 42), .nowOrNever])
        #expect(Self.admit(lasting, tokens: 1).admissions == [.coalesced(by: "3"), .coalesced(by: "3"), .send])

        let rejected = AnswerRecord(status: "rejected", httpStatus: 400, reason: "BadCollapseId")
        let parsed = [Self.intent("1", collapse: "c"), Self.intent("2", collapse: "c")]
        let (admissions, spent) = Self.admit(parsed, records: ["2": rejected], tokens: 3)
        #expect(admissions == [.send, .duplicate(rejected)])
        #expect(spent == 1)

        // One delivered before is the survivor: it went out.
        let delivered = AnswerRecord(status: "delivered", httpStatus: 200)
        #expect(Self.admit(parsed, records: ["2": delivered], tokens: 3) == ([.coalesced(by: "2"), .duplicate(delivered)], 0))
        // So is one in its mailbox already (a redelivery).
        #expect(Self.admit(parsed, tokens: 3, waiting: "1:2").admissions == [.coalesced(by: "2"), .inMailbox])
        // An older one that would have to wait while a newer intent of the batch goes out now
        // would reach the device after it: the newer one supersedes it.
        let between = [Self.intent("1", collapse: "c"), Self.intent("2"), Self.intent("3", collapse: "c", expiration: 0)]
        #expect(Self.admit(between, tokens: 1).admissions == [.coalesced(by: "2"), .send, .nowOrNever])
        #expect(Self.admit(between, tokens: 2).admissions == [.coalesced(by: "3"), .send, .send])
        // Behind another intent of the mailbox the newest waits, and is the one parked.
        #expect(Self.admit(parsed, tokens: 3, waiting: "1:9").admissions == [.coalesced(by: "2"), .park(due: 42)])
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
