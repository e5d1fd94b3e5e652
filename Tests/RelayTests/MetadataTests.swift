import Foundation
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// An intent's `metadata` travels, as it came, into every outcome of the intent — delivered,
/// coalesced, sent from a mailbox, duplicate, invalid, unregistered — and its invalidation record.
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
}
