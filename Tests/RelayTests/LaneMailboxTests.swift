import Foundation
import Redis
@testable import Relay
import RedisTesting
import Testing
import TestSupport

/// Mailboxes with priority lanes: a parked intent remembers its lane, waits in that lane's due
/// index, and its outcome names the lane.
@Suite("Priority lanes and mailboxes", .stopsItsRelays, .timeLimit(.minutes(2)))
struct LaneMailboxTests {
    @Test func anIntentParkedFromALaneIsDeliveredFromItsLanesDueIndex() async throws {
        let redis = try await RedisServerProcess.started()
        let urgentTopic = "apns.intents.urgent.\(UUID().uuidString.prefix(8))"
        let harness = try await PolicyTests.harness(redis, burst: 1, refill: 0.5) {
            $0.kafka.lanes = [.init(topic: urgentTopic, weight: 4), .init(topic: $0.kafka.intentsTopic, weight: 1)]
        }
        let token = hexToken(0x1a9e)
        try await harness.produce(intent("first", token: token), key: token, topic: urgentTopic)
        try await harness.produce(intent("second", token: token), key: token, topic: urgentTopic)
        // "second" waits for the device's next token in its mailbox, indexed under its lane.
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        // Parked, then indexed (the index write follows the park script).
        var parked = RESPValue.null
        var indexed: [String] = []
        try await waitUntil(asking: {
            parked = (try? await client.send(RedisCommand("HGET", ["apns-relay:mailbox:{\(token)}:com.example.app", "p"]))) ?? .null
            indexed = (try? await client.send(RedisCommand("KEYS", ["apns-relay:due:*"])))?.array?.compactMap(\.string) ?? []
            return !parked.isNull && !indexed.isEmpty
        })
        #expect(indexed.count == 1 && indexed.allSatisfy { $0.hasPrefix("apns-relay:due:{\(urgentTopic):") }, "\(indexed)")
        let header = try #require(parked.bytes.flatMap { $0.split(separator: UInt8(ascii: "\n")).first }).map { Character(UnicodeScalar($0)) }
        #expect(String(header).hasSuffix(" " + urgentTopic), "\(String(header))")
        let outcomes = try await harness.outcomes(count: 2)
        let second = try #require(outcomes.first { $0["id"] as? String == "second" })
        #expect(second["status"] as? String == "delivered")
        #expect(second["lane"] as? String == urgentTopic)
        #expect(outcomes.allSatisfy { $0["lane"] as? String == urgentTopic })
        // Its lane's due index held it (and lets it go once it was sent).
        let partition = try #require(second["partition"] as? Int)
        #expect(try await client.send(RedisCommand("EXISTS", [RedisKeys.standard.due(intentsTopic: urgentTopic, partition: Int32(partition))])).integer == 0)
        #expect(harness.pipeline.outcomeCounts == ["delivered": 2])
        await client.shutdown()
        await harness.stop()
    }

    /// An entry that names its lane, found in another lane's due index (as a device's entries
    /// of two lanes share its mailbox), is delivered by that index's owner and its outcome names
    /// its own lane, partition and offset, not the index's.
    @Test func anEntryFoundInAnotherLanesIndexNamesItsOwnCoordinates() async throws {
        let redis = try await RedisServerProcess.started()
        let urgentTopic = "apns.intents.urgent.\(UUID().uuidString.prefix(8))"
        let token = hexToken(0x02d)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10) {
            $0.kafka.lanes = [.init(topic: urgentTopic, weight: 4), .init(topic: $0.kafka.intentsTopic, weight: 1)]
        }
        var entry = DevicePolicy.Entry(partition: 3, offset: 817, consumedAt: Int64(Date().timeIntervalSince1970 * 1000),
                                       expiration: expiration, message: Array(intent("bulk-one", token: token).utf8))
        entry.lane = harness.intentsTopic
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"),
                                  "pid", "bulk-one", "p", entry.encoded, "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "8:bulk-one"]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: urgentTopic, partition: 0), 0,
                                  RedisKeys.member(token: token, topic: "com.example.app", id: "bulk-one")]),
        ])
        let outcome = try #require(try await harness.outcomes(count: 1).first)
        #expect(outcome["id"] as? String == "bulk-one" && outcome["status"] as? String == "delivered")
        #expect(outcome["lane"] as? String == harness.intentsTopic && outcome["partition"] as? Int == 3 && outcome["offset"] as? Int == 817,
                "\(outcome)")
        await client.shutdown()
        // Its offset is not one of the intents topic's (the entry was written here): no log check.
        await harness.stop()
    }

    /// An entry parked before `kafka.lanes` was set names no lane; found in the due index of a
    /// lane that is not the first, it is that lane's, whatever the first lane is.
    @Test func anEntryParkedBeforeLanesBelongsToTheDueIndexItWaitsIn() async throws {
        let redis = try await RedisServerProcess.started()
        let urgentTopic = "apns.intents.urgent.\(UUID().uuidString.prefix(8))"
        let token = hexToken(0x01d)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let entry = DevicePolicy.Entry(partition: 0, offset: 0, consumedAt: Int64(Date().timeIntervalSince1970 * 1000),
                                       expiration: expiration, message: Array(intent("parked-before", token: token).utf8))
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10) {
            // As check-config reads it: the first lane is the intents topic.
            $0.kafka.lanes = [.init(topic: urgentTopic, weight: 4), .init(topic: $0.kafka.intentsTopic, weight: 1)]
            $0.kafka.intentsTopic = urgentTopic
        }
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"),
                                  "pid", "parked-before", "p", entry.encoded, "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "13:parked-before"]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0), 0,
                                  RedisKeys.member(token: token, topic: "com.example.app", id: "parked-before")]),
        ])
        let outcome = try #require(try await harness.outcomes(count: 1).first)
        #expect(outcome["id"] as? String == "parked-before" && outcome["status"] as? String == "delivered")
        #expect(outcome["lane"] as? String == harness.intentsTopic)
        // Released from the index it waited in.
        try await waitUntil(asking: {
            (try? await client.send(RedisCommand("EXISTS", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0)])).integer) == 0
        })
        await client.shutdown()
        await harness.stop()
    }
}
