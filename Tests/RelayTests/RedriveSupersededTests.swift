import Foundation
import Redis
@testable import Relay
import Testing

/// What keeps a re-drive from putting older content on a device after newer: another intent of
/// the device with the same `collapse_id` that came after it, whatever its answer, and (with
/// Redis) a newer intent waiting in the device's mailbox or being sent from it.
@Suite("Re-drive: superseded intents")
struct RedriveSupersededTests {
    static let token = String(repeating: "ab", count: 32)

    static func outcome(_ id: String, status: String, reason: String? = nil, collapse: String? = "score", lane: String = "intents",
                        partition: Int = 0, offset: Int, at: Int, consumed: Int? = nil) -> RedriveSelection.Outcome {
        var object: [String: Any] = ["id": id, "token": token, "topic": "com.example.app", "status": status, "lane": lane,
                                     "partition": partition, "offset": offset, "at": at, "latency_ms": at - (consumed ?? at)]
        if let reason { object["reason"] = reason }
        if let collapse { object["collapse_id"] = collapse }
        return RedriveSelection.Outcome(json: [UInt8](try! JSONSerialization.data(withJSONObject: object)))!
    }

    /// An outcome record whose `at` less its `latency_ms` would overflow (not one a relay
    /// writes, but the command reads whatever the topic holds) is read, not a crash.
    @Test func anOutcomeWhoseTimesOverflowIsReadNotACrash() throws {
        let object: [String: Any] = ["id": "odd", "token": Self.token, "topic": "com.example.app", "status": "failed",
                                     "lane": "intents", "partition": 0, "offset": 1, "at": -2, "latency_ms": Int.max]
        let outcome = try #require(RedriveSelection.Outcome(json: [UInt8](try JSONSerialization.data(withJSONObject: object))))
        #expect(outcome.consumedAt == .min)
    }

    static func decide(_ outcomes: [RedriveSelection.Outcome], reasonPrefix: String? = nil) -> (redrive: [String], superseded: [String]) {
        var filter = RedriveFilter(since: 0)
        filter.reasonPrefix = reasonPrefix
        var selection = RedriveSelection(filter: filter)
        for outcome in outcomes { selection.add(outcome) }
        let (redrive, skipped) = selection.decide()
        return (redrive.map(\.id), skipped.filter { $0.1 == .superseded }.map(\.0.id))
    }

    /// The older intent failed after its retries, answered after the newer one was delivered
    /// (a newer intent on another partition, or one that did not wait for it): still superseded.
    @Test func aNewerIntentDeliveredBeforeTheOlderFailedSupersedesIt() {
        let decided = Self.decide([
            Self.outcome("newer", status: "delivered", lane: "intents.urgent", offset: 9, at: 1_000, consumed: 900),
            Self.outcome("older", status: "failed", reason: "RetryDeadline", offset: 5, at: 30_000, consumed: 500),
        ])
        #expect(decided.redrive.isEmpty && decided.superseded == ["older"], "\(decided)")
        // In the same partition, the offset says which is newer, whenever each was answered.
        let sameLane = Self.decide([
            Self.outcome("newer", status: "delivered", offset: 6, at: 1_000),
            Self.outcome("older", status: "failed", reason: "RetryDeadline", offset: 5, at: 30_000),
        ])
        #expect(sameLane.superseded == ["older"], "\(sameLane)")
    }

    /// A newer intent that is not re-driven (the filter leaves it out, or it expired) supersedes
    /// the older one all the same; an older one never supersedes a newer one.
    @Test func aNewerIntentNotRedrivenSupersedesToo() {
        let decided = Self.decide([
            Self.outcome("older", status: "failed", reason: "RetryDeadline", offset: 5, at: 30_000),
            Self.outcome("newer", status: "failed", reason: "CredentialFault: ExpiredProviderToken", offset: 6, at: 31_000),
            Self.outcome("newest", status: "expired", offset: 7, at: 32_000),
        ], reasonPrefix: "RetryDeadline")
        #expect(decided.redrive.isEmpty && decided.superseded == ["older"], "\(decided)")
        let alone = Self.decide([
            Self.outcome("old", status: "delivered", offset: 1, at: 500),
            Self.outcome("failing", status: "failed", reason: "RetryDeadline", offset: 5, at: 30_000),
            Self.outcome("other", status: "delivered", collapse: "chat", offset: 8, at: 40_000),
        ])
        #expect(alone.redrive == ["failing"] && alone.superseded.isEmpty, "\(alone)")
    }

    /// A re-driven copy that failed again is placed where its original was: the newer intent
    /// delivered between the two still supersedes it, whatever the copy's own offset.
    @Test func aRedrivenCopyIsComparedWhereItsOriginalWas() throws {
        var copy: [String: Any] = ["id": "older", "token": Self.token, "topic": "com.example.app", "status": "failed",
                                   "reason": "RetryDeadline", "collapse_id": "score", "lane": "intents", "partition": 0, "offset": 20,
                                   "at": 60_000, "latency_ms": 100]
        copy["redrive"] = ["lane": "intents", "partition": 0, "offset": 5, "at": 59_000]
        let redriven = try #require(RedriveSelection.Outcome(json: [UInt8](try JSONSerialization.data(withJSONObject: copy))))
        #expect(redriven.origin == .init(lane: "intents", partition: 0, offset: 5))
        let decided = Self.decide([
            Self.outcome("older", status: "failed", reason: "RetryDeadline", offset: 5, at: 30_000, consumed: 500),
            Self.outcome("newer", status: "delivered", offset: 6, at: 31_000, consumed: 30_500),
            redriven,
        ])
        #expect(decided.redrive.isEmpty && decided.superseded == ["older"], "\(decided)")
    }

    /// With Redis: the device's mailbox holding a newer intent (parked, or being sent) keeps the
    /// older one from being re-driven; an older entry, or the intent itself, does not.
    @Test func aNewerIntentInTheMailboxSupersedes() {
        let failed = Self.outcome("failed", status: "failed", reason: "CredentialFault", offset: 5, at: 30_000, consumed: 30_000)
        func entry(offset: Int64, consumedAt: Int64, lane: String? = nil, collapse: String? = nil) -> RESPValue {
            let message = collapse.map { #"{"collapse_id":"\#($0)"}"# } ?? "{}"
            var entry = DevicePolicy.Entry(partition: 0, offset: offset, consumedAt: consumedAt, expiration: 1_900_000_000, message: Array(message.utf8))
            entry.lane = lane
            return .bulk(entry.encoded)
        }
        func holds(_ fields: [RESPValue]) -> Bool {
            Redrive.mailboxHoldsNewer(.array(fields), than: failed, defaultLane: "intents")
        }
        #expect(holds([.bulk(Array("parked".utf8)), entry(offset: 6, consumedAt: 1_000), .null, .null]))
        // Being sent: superseding only with the same collapse id (else the copy follows it).
        #expect(holds([.null, .null, .bulk(Array("sending".utf8)), entry(offset: 9, consumedAt: 1_000, collapse: "score")]))
        #expect(!holds([.null, .null, .bulk(Array("sending".utf8)), entry(offset: 9, consumedAt: 1_000, collapse: "chat")]))
        #expect(!holds([.null, .null, .bulk(Array("sending".utf8)), entry(offset: 9, consumedAt: 1_000)]))
        #expect(!holds([.bulk(Array("parked".utf8)), entry(offset: 4, consumedAt: 40_000), .null, .null]), "older in the same partition")
        // On another lane, by when it was consumed.
        #expect(holds([.bulk(Array("parked".utf8)), entry(offset: 1, consumedAt: 31_000, lane: "intents.bulk"), .null, .null]))
        #expect(!holds([.bulk(Array("parked".utf8)), entry(offset: 99, consumedAt: 29_000, lane: "intents.bulk"), .null, .null]))
        #expect(!holds([.bulk(Array("failed".utf8)), entry(offset: 5, consumedAt: 1_000), .null, .null]), "the intent itself")
        #expect(!holds([.null, .null, .null, .null]))
        #expect(holds([.bulk(Array("parked".utf8)), .bulk(Array("unreadable".utf8)), .null, .null]), "what cannot be told")
    }

    /// The filter: statuses (`failed` unless asked), the time range, a reason prefix, apps and
    /// lanes, each narrowing the others.
    @Test func theFilterNarrowsByEachOfItsFields() {
        func outcome(_ id: String, status: String = "failed", reason: String? = "RetryDeadline", topic: String = "com.example.app",
                     lane: String = "intents", at: Int) -> RedriveSelection.Outcome {
            RedriveSelection.Outcome(id: id, recipient: Self.token, topic: topic, status: status, reason: reason, lane: lane,
                                     partition: 0, offset: Int64(at), at: Int64(at))
        }
        let outcomes = [
            outcome("early", at: 500), outcome("in", at: 1_500), outcome("late", at: 9_500),
            outcome("expired", status: "expired", reason: nil, at: 1_600),
            outcome("credential", reason: "CredentialFault: ExpiredProviderToken", at: 1_700),
            outcome("other-app", topic: "com.example.other", at: 1_800),
            outcome("bulk", lane: "intents.bulk", at: 1_900),
        ]
        func chosen(_ change: (inout RedriveFilter) -> Void) -> [String] {
            var filter = RedriveFilter(since: 1_000)
            filter.until = 9_000
            change(&filter)
            return outcomes.filter(filter.matches).map(\.id)
        }
        #expect(chosen { _ in } == ["in", "credential", "other-app", "bulk"])
        #expect(chosen { $0.until = nil } == ["in", "late", "credential", "other-app", "bulk"])
        #expect(chosen { $0.statuses = ["failed", "expired"] } == ["in", "expired", "credential", "other-app", "bulk"])
        #expect(chosen { $0.reasonPrefix = "RetryDeadline" } == ["in", "other-app", "bulk"])
        #expect(chosen { $0.reasonPrefix = "CredentialFault" } == ["credential"])
        #expect(chosen { $0.topics = ["com.example.other"] } == ["other-app"])
        #expect(chosen { $0.lanes = ["intents.bulk"] } == ["bulk"])
        #expect(chosen { $0.lanes = ["intents"]; $0.topics = ["com.example.app"]; $0.reasonPrefix = "Retry" } == ["in"])
    }
}
