import Foundation
import Kafka
import Redis
import RedisTesting
@testable import Relay
import KafkaTesting
import TestSupport
import Testing

/// `kafka.invalidations_topic`: a record per 410, a tombstone per delivery, at least once.
@Suite("The invalidations topic", .stopsItsRelays, .timeLimit(.minutes(3)))
struct InvalidationTests {
    static let gone = hexToken(0x410)
    static let key = "com.example.app/\(gone)"
    static let unregisteredAt: Int64 = 1_432_819_882_000

    static func harness(redis: RedisServerProcess? = nil) async throws -> RelayHarness {
        try await RelayHarness.start(configure: { $0.behaviour.unregistered = [gone: unregisteredAt] }, configureRelay: {
            $0.kafka.invalidationsTopic = "apns.invalidations.\(UUID().uuidString.prefix(8))"
            if let redis { TestRedis(redis).apply(to: &$0) }
        })
    }

    /// The invalidations topic to its end (or, with `atLeast`, until that many records came: the
    /// relay waits for a record's acknowledgement after its outcome's), each value checked
    /// against `docs/invalidation.schema.json` (tombstones have none).
    static func records(_ harness: RelayHarness, atLeast: Int? = nil,
                        sourceLocation: SourceLocation = #_sourceLocation) async throws -> [KafkaMessage] {
        let messages = try await withTopicReader(harness.cluster.bootstrapServers, harness.configuration.kafka.invalidationsTopic) {
            if let atLeast { try await $0.read(timeout: .seconds(30)) { _, total in total >= atLeast } } else {
                try await $0.readToEnd(timeout: .seconds(30))
            }
        }
        let schema = try JSONSchemaCheck(docs: "invalidation.schema.json")
        for message in messages where !message.hasNullValue {
            let problems = (try? schema.problems(JSONValue(parsing: message.value))) ?? ["not JSON"]
            #expect(problems.isEmpty, "\(String(decoding: message.value, as: UTF8.self)): \(problems)", sourceLocation: sourceLocation)
        }
        return messages
    }

    static func object(_ message: KafkaMessage) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any])
    }

    /// A 410 publishes the pair as dead; a later delivery to it, a tombstone; answers that say
    /// nothing about the token (rejected, invalid) publish nothing.
    @Test func aDeadTokenIsPublishedAndALaterDeliveryTombstonesIt() async throws {
        let harness = try await Self.harness()
        try await harness.produce(intent("gone-1", token: Self.gone), key: Self.gone)
        try await harness.produce(#"{"id":"broken"#, key: "x")
        try await harness.produce(intent("too-big", token: hexToken(0x1), payload: #"{"aps":{"alert":"\#(String(repeating: "x", count: 5000))"}}"#),
                                  key: hexToken(0x1))
        let first = PolicyTests.byID(try await harness.outcomes(count: 3))
        #expect(first["gone-1"]?["status"] as? String == "unregistered")
        var records = try await Self.records(harness, atLeast: 1)
        #expect(records.count == 1)
        let dead = try Self.object(try #require(records.first))
        #expect(records.first.map { String(decoding: $0.key ?? [], as: UTF8.self) } == Self.key)
        #expect(dead["token"] as? String == Self.gone)
        #expect(dead["topic"] as? String == "com.example.app")
        #expect(dead["unregistered_at"] as? Int == Int(Self.unregisteredAt))
        #expect(dead["reason"] as? String == "Unregistered")
        #expect(dead["intent_id"] as? String == "gone-1")
        #expect(dead["apns_id"] as? String == first["gone-1"]?["apns_id"] as? String)
        #expect(dead["at"] as? Int == first["gone-1"]?["at"] as? Int)
        var state = InvalidationTopic()
        records.forEach { state.apply($0) }
        #expect(state.count == 1)

        // The app registered the token again: the next intent is delivered.
        harness.simulator.update { $0.unregistered = [:] }
        try await harness.produce(intent("back-1", token: Self.gone), key: Self.gone)
        #expect(PolicyTests.byID(try await harness.outcomes(count: 4))["back-1"]?["status"] as? String == "delivered")
        try await harness.stopExpectingOneOutcomeEach()
        records = try await Self.records(harness)
        #expect(records.count == 2)
        let tombstone = try #require(records.last)
        #expect(tombstone.hasNullValue)
        #expect(String(decoding: tombstone.key ?? [], as: UTF8.self) == Self.key)
        #expect(records.map(\.partition) == [records[0].partition, records[0].partition], "one key, one partition: compaction keeps the last")
        let current = try await InvalidationTopic.read(bootstrapServers: harness.cluster.bootstrapServers,
                                                       topic: harness.configuration.kafka.invalidationsTopic, timeout: .seconds(30))
        #expect(current.count == 0)
    }

    /// An intent answered again as a `duplicate` publishes what its first answer meant once
    /// more: the first publishing may not have happened (a relay stopped between the outcome
    /// and the record); `delivered` ones, a tombstone.
    @Test func aDuplicatePublishesItsFirstAnswersRecordAgain() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis: redis)
        let alive = hexToken(0x411)
        try await harness.produce(intent("gone-1", token: Self.gone), key: Self.gone)
        try await harness.produce(intent("alive-1", token: alive), key: alive)
        _ = try await harness.outcomes(count: 2)
        try await harness.produce(intent("gone-1", token: Self.gone), key: Self.gone)
        try await harness.produce(intent("alive-1", token: alive), key: alive)
        let again = try await harness.outcomes(count: 4).filter { $0["status"] as? String == "duplicate" }
        #expect(again.count == 2)
        #expect(harness.simulator.accepted.count == 1)
        try await harness.stopExpectingOneOutcomeEach()
        let records = try await Self.records(harness)
        let byKey = Dictionary(grouping: records) { String(decoding: $0.key ?? [], as: UTF8.self) }
        let gone = try #require(byKey[Self.key])
        #expect(gone.count == 2)
        #expect(try gone.map { try Self.object($0)["unregistered_at"] as? Int } == [Int(Self.unregisteredAt), Int(Self.unregisteredAt)])
        let apnsIDs = try gone.map { try Self.object($0)["apns_id"] as? String }
        #expect(apnsIDs.count == 2 && apnsIDs[0] != nil && apnsIDs[0] == apnsIDs[1], "the first answer's apns-id both times")
        let tombstones = try #require(byKey["com.example.app/\(alive)"])
        #expect(tombstones.count == 2 && tombstones.allSatisfy(\.hasNullValue))
    }

    /// A dead record that lands after another relay delivered to the pair (and published its
    /// tombstone, which landed first: two producers, no order between them) is followed by a
    /// tombstone, so the compacted topic does not end up calling a live token dead. The record's
    /// produce request is held on its broker; meanwhile the other relay's delivery is recorded
    /// in Redis as a relay records one, before its tombstone. Without the check, the topic
    /// ended with the dead record.
    @Test func aDeadRecordLandingAfterALaterDeliveryIsFollowedByATombstone() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await RelayHarness.start(configure: { $0.behaviour.unregistered = [Self.gone: Self.unregisteredAt] }, configureRelay: {
            $0.kafka.invalidationsTopic = "apns.invalidations.\(UUID().uuidString.prefix(8))"
            TestRedis(redis).apply(to: &$0)
        }, brokers: 2)
        // The first produce request the invalidations' broker gets (the dead record's) is
        // refused 3 s later; the producer then sends it again.
        harness.cluster.pushBrokerRequestErrors(broker: 2, apiKey: KafkaMockCluster.APIKey.produce,
                                                [(KafkaErrorCode.notEnoughReplicas, 3_000)])
        try await harness.produce(intent("gone-1", token: Self.gone), key: Self.gone)
        let answered = try #require(try await harness.outcomes(count: 1).first)
        #expect(answered["status"] as? String == "unregistered")
        try await waitUntil { harness.cluster.brokerErrorsLeft(broker: 2, apiKey: KafkaMockCluster.APIKey.produce) == 0 }
        // Another relay's later delivery to the pair, recorded (its tombstone is not needed
        // here: the topic must end without the pair either way).
        let at = Int64(Date().timeIntervalSince1970 * 1000) + 1
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.send(RedisCommand("SET", [RedisKeys.standard.lastSent(token: Self.gone, topic: "com.example.app"),
                                                       #"{"id":"alive-elsewhere","apns_id":null,"at":\#(at),"payload":{}}"#]))
        await client.shutdown()
        #expect(await harness.pipeline.idle(within: .seconds(30)))
        try await harness.stopExpectingOneOutcomeEach()
        let records = try await Self.records(harness)
        #expect(records.map(\.hasNullValue) == [false, true], "the dead record, then a tombstone")
        var state = InvalidationTopic()
        for record in records { state.apply(record) }
        #expect(state.count == 0)
    }

    /// Without a later delivery the dead record stands alone (an earlier one changes nothing).
    @Test func aDeadRecordAfterAnEarlierDeliveryStands() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis: redis)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let before = Int64(Date().timeIntervalSince1970 * 1000) - 60_000
        _ = try await client.send(RedisCommand("SET", [RedisKeys.standard.lastSent(token: Self.gone, topic: "com.example.app"),
                                                       #"{"id":"earlier","apns_id":null,"at":\#(before),"payload":{}}"#]))
        await client.shutdown()
        try await harness.produce(intent("gone-1", token: Self.gone), key: Self.gone)
        _ = try await harness.outcomes(count: 1)
        #expect(await harness.pipeline.idle(within: .seconds(30)))
        try await harness.stopExpectingOneOutcomeEach()
        #expect(try await Self.records(harness).map(\.hasNullValue) == [false])
    }

    /// The topic's state as `apns-relay invalidations` reads it: the last record per key wins, a
    /// tombstone removes the key, `since` keeps only pairs published at or after it.
    @Test func theCurrentStateIsTheLastRecordPerKey() throws {
        func record(_ key: String, _ at: Int64?, offset: Int64) -> KafkaMessage {
            let value = at.map { Invalidation(token: key, topic: "t", unregisteredAt: $0, reason: "Unregistered", apnsID: nil,
                                              intentID: nil, at: $0).utf8 }
            var message = KafkaMessage(topic: "x", partition: 0, offset: offset, key: Array("t/\(key)".utf8), value: value ?? [],
                                       timestamp: nil)
            message.hasNullValue = value == nil
            return message
        }
        var state = InvalidationTopic()
        for message in [record("a", 100, offset: 0), record("b", 200, offset: 1), record("a", nil, offset: 2),
                        record("c", 300, offset: 3), record("b", 400, offset: 4)] {
            state.apply(message)
        }
        #expect(state.count == 2)
        let tokens = try state.records().map { try #require(try JSONSerialization.jsonObject(with: Data($0)) as? [String: Any])["token"] as? String }
        #expect(tokens == ["b", "c"])
        #expect(state.records(since: 350).count == 1)
        #expect(state.records(since: 500).isEmpty)
    }
}
