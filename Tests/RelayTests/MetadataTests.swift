import Foundation
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// An intent's `metadata` travels, as it came, into every outcome of the intent — delivered,
/// coalesced, sent from a mailbox, duplicate, invalid, unregistered, expired, rejected, failed — and its
/// invalidation record.
@Suite("Metadata that travels", .stopsItsRelays, .timeLimit(.minutes(3)))
struct MetadataTests {
    static func metadata(_ id: String) -> String { #","metadata":{"user":"u-\#(id)","campaign":{"name":"spring","wave":2}}"# }

    static func user(_ outcome: [String: Any]?) -> String? { (outcome?["metadata"] as? [String: Any])?["user"] as? String }

    @Test func everyOutcomeCarriesItsIntentsMetadata() async throws {
        let redis = try await RedisServerProcess.started()
        let gone = hexToken(0x410), device = hexToken(0x3E7)
        // Burst 1: a device's second intent parks, and its third displaces it from the mailbox.
        let harness = try await PolicyTests.harness(redis, burst: 1, refill: 0.2, configure: {
            $0.kafka.invalidationsTopic = "apns.invalidations.\(UUID().uuidString.prefix(8))"
        }, simulator: { $0.behaviour.unregistered = [gone: 1_432_819_882_000] })
        try await harness.produce(intent("sent", token: device, extra: Self.metadata("sent")), key: device)
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        try await harness.produce(intent("parked", token: device, extra: Self.metadata("parked")), key: device)
        try await harness.produce(intent("newest", token: device, extra: Self.metadata("newest")), key: device)
        try await harness.produce(intent("gone", token: gone, extra: Self.metadata("gone")), key: gone)
        // Not usable for another reason: its outcome carries the metadata all the same.
        try await harness.produce(#"{"id":"broken","token":"\#(device)","topic":"com.example.app","payload":[1]\#(Self.metadata("broken"))}"#, key: device)
        // Metadata over 1024 bytes, and metadata that is not an object.
        let big = String(repeating: "x", count: 1100)
        try await harness.produce(intent("big", token: hexToken(0x1), extra: #","metadata":{"x":"\#(big)"}"#), key: hexToken(0x1))
        try await harness.produce(intent("list", token: hexToken(0x2), extra: #","metadata":["a"]"#), key: hexToken(0x2))
        var outcomes = PolicyTests.byID(try await harness.outcomes(count: 7))
        #expect(outcomes["sent"]?["status"] as? String == "delivered" && Self.user(outcomes["sent"]) == "u-sent")
        #expect(outcomes["parked"]?["status"] as? String == "coalesced" && Self.user(outcomes["parked"]) == "u-parked")
        #expect(outcomes["newest"]?["status"] as? String == "delivered" && Self.user(outcomes["newest"]) == "u-newest",
                "sent from the mailbox: \(outcomes["newest"] ?? [:])")
        #expect(outcomes["gone"]?["status"] as? String == "unregistered" && Self.user(outcomes["gone"]) == "u-gone")
        #expect(outcomes["broken"]?["status"] as? String == "invalid" && Self.user(outcomes["broken"]) == "u-broken")
        for id in ["big", "list"] {
            #expect(outcomes[id]?["status"] as? String == "invalid", "\(id)")
            #expect((outcomes[id]?["reason"] as? String)?.hasPrefix("BadMetadata") == true, "\(id): \(outcomes[id] ?? [:])")
            #expect(outcomes[id]?["metadata"] is NSNull, "\(id)")
        }
        // The nested value as it came (compact).
        #expect(((outcomes["sent"]?["metadata"] as? [String: Any])?["campaign"] as? [String: Any])?["wave"] as? Int == 2)
        // A redelivery: `duplicate`, with the redelivered intent's metadata.
        try await harness.produce(intent("sent", token: device, extra: Self.metadata("sent")), key: device)
        outcomes = PolicyTests.byID(Array(try await harness.outcomes(count: 8).suffix(1)))
        #expect(outcomes["sent"]?["status"] as? String == "duplicate" && Self.user(outcomes["sent"]) == "u-sent")
        try await harness.stopExpectingOneOutcomeEach()
        let records = try await InvalidationTests.records(harness)
        let dead = try records.filter { !$0.hasNullValue }.map { try InvalidationTests.object($0) }
        #expect(dead.count == 1 && Self.user(dead.first) == "u-gone", "\(dead)")
    }

    /// The other statuses carry it too: `coalesced` in its batch, `expired`, `rejected`.
    @Test func theOtherStatusesCarryItToo() async throws {
        let redis = try await RedisServerProcess.started()
        let collapsing = hexToken(0xc5), foreign = hexToken(0xc6)
        let harness = try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: {
            $0.retry.deadlineSeconds = 1
        }, simulator: { $0.behaviour.deviceTopics = [foreign: "com.example.other"] }, preload: [
            (intent("older", token: collapsing, extra: #","collapse_id":"score""# + Self.metadata("older")), collapsing),
            (intent("newer", token: collapsing, extra: #","collapse_id":"score""# + Self.metadata("newer")), collapsing),
            (intent("stale", token: hexToken(0xc8), extra: #","expiration":1000"# + Self.metadata("stale")), hexToken(0xc8)),
            (intent("foreign", token: foreign, extra: Self.metadata("foreign")), foreign),
        ])
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 4))
        #expect(outcomes["older"]?["status"] as? String == "coalesced" && Self.user(outcomes["older"]) == "u-older")
        #expect(outcomes["newer"]?["status"] as? String == "delivered" && Self.user(outcomes["newer"]) == "u-newer")
        #expect(outcomes["stale"]?["status"] as? String == "expired" && Self.user(outcomes["stale"]) == "u-stale")
        #expect(outcomes["foreign"]?["status"] as? String == "rejected" && Self.user(outcomes["foreign"]) == "u-foreign")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// And `failed`: APNs answers 500 or 503 past the retry deadline (without Redis, where such
    /// an intent parks instead).
    @Test func aFailedIntentCarriesIt() async throws {
        let harness = try await RelayHarness.start(configure: { $0.behaviour.failureRate = 1 },
                                                   configureRelay: { $0.retry.deadlineSeconds = 1 })
        let token = hexToken(0xc7)
        try await harness.produce(intent("unlucky", token: token, extra: Self.metadata("unlucky")), key: token)
        let outcome = try #require(try await harness.outcomes(count: 1).first)
        #expect(outcome["status"] as? String == "failed" && Self.user(outcome) == "u-unlucky", "\(outcome)")
        try await harness.stopExpectingOneOutcomeEach()
    }
}
