import Foundation
import Kafka
import KafkaTesting
import RedisTesting
import Relay
import TestSupport
import Testing

/// The invalidations topic with `apns-relay run` as a process: at least once across a kill -9,
/// and `apns-relay invalidations` reading what it holds.
@Suite("Invalidation records across a crash", .timeLimit(.minutes(3)))
struct InvalidationProcessTests {
    /// A relay killed after a 410's outcome is out and before its invalidation record is: the
    /// intent's offset was not committed, so the next relay answers it again (`duplicate`, from
    /// the dedupe record) and publishes the record. Then `apns-relay invalidations` prints it.
    @Test func theRecordOutlivesAKillBetweenTheOutcomeAndIt() async throws {
        let gone = hexToken(0x410), unregisteredAt: Int64 = 1_432_819_882_000
        // Three brokers: the intents and outcomes live on the first two, the invalidations on
        // the third, whose produce requests can be held without holding the outcomes.
        let harness = try await ProcessHarness.start(brokers: 3, configure: { $0.behaviour.unregistered = [gone: unregisteredAt] })
        let invalidations = "invalidations-\(UUID().uuidString.prefix(8))"
        try harness.cluster.createTopic(invalidations, partitions: 4)
        for partition in Int32(0)..<4 {
            harness.cluster.setLeader(topic: harness.intentsTopic, partition: partition, broker: 1 + partition % 2)
            harness.cluster.setLeader(topic: harness.outcomesTopic, partition: partition, broker: 1 + partition % 2)
            harness.cluster.setLeader(topic: invalidations, partition: partition, broker: 3)
        }
        // The intent is on the topic before anything can meet the error below: a CI run showed
        // a test-side produce request reaching broker 3 and taking it.
        let producer = try KafkaProducer(bootstrapServers: harness.cluster.bootstrapServers)
        _ = try await producer.send(topic: harness.intentsTopic, key: Array(gone.utf8), value: Array(intent("gone-1", token: gone).utf8))
        // The first produce request broker 3 gets from now on — the relay's record, as nothing
        // else produces until its outcome is read — is refused 120 s later: the record is held
        // while the outcome goes out, and until the relay is killed, however slowly a loaded
        // machine gets through the checks in between. The relay's producer waits longer still
        // for the answer, so it does not give up on the request and send it again meanwhile:
        // librdkafka times a produce request out after `socket.timeout.ms` (60 s by default),
        // whatever `request.timeout.ms` (the acknowledgement timeout it asks of the broker) says.
        // With 60 s, a loaded run (the thread sanitizer's) saw the request resent and the record
        // stored before the kill, in 2 of 4 runs.
        harness.cluster.pushBrokerRequestErrors(broker: 3, apiKey: KafkaMockCluster.APIKey.produce,
                                                [(KafkaErrorCode.notEnoughReplicas, 120_000)])
        let redis = try await RedisServerProcess.started()
        let config = try writeConfig(harness: harness, redisURL: redis.url, invalidationsTopic: invalidations)
        try String(contentsOfFile: config, encoding: .utf8)
            .replacingOccurrences(of: "    heartbeat.interval.ms: 500", with: "    heartbeat.interval.ms: 500\n    request.timeout.ms: 180000\n    socket.timeout.ms: 180000")
            .write(toFile: config, atomically: true, encoding: .utf8)
        let first = try RelayProcess.start(config: config)
        let answered: [String]
        do {
            answered = try await harness.outcomes(distinct: 1)
        } catch {
            first.kill9()
            Issue.record("no outcome from the first relay; it printed:\n\(first.printed.suffix(12_000))")
            throw error
        }
        #expect(answered.count == 1 && answered[0].contains(#""status":"unregistered""#), "\(answered)")
        // The record's request reached broker 3 (the error was taken) and is held there.
        try await waitUntil { harness.cluster.brokerErrorsLeft(broker: 3, apiKey: KafkaMockCluster.APIKey.produce) == 0 }
        #expect(try await recordsPerPartition(harness.cluster.bootstrapServers, invalidations).values.reduce(0, +) == 0)
        // Messages that need no record (unusable ones) on the other partitions: once one of
        // them is committed, a commit ran after the 410's outcome was out, and the 410's
        // partition must still be at 0.
        let goneOutcome = try #require(try JSONSerialization.jsonObject(with: Data(answered[0].utf8)) as? [String: Any])
        let goneIndex = try #require(goneOutcome["partition"] as? Int)
        for index in 0..<12 {
            _ = try await producer.send(topic: harness.intentsTopic, key: Array("other-\(index)".utf8), value: Array("not json".utf8))
        }
        var committed: [Int: Int64] = [:]
        try await waitUntil(timeout: .seconds(30), asking: {
            committed = (try? await Self.committed(harness)) ?? [:]
            return committed.contains { $0.key != goneIndex && $0.value > 0 }
        })
        #expect((committed[goneIndex] ?? 0) <= 0, "the 410's offset waited for its record: \(committed)")
        first.kill9()

        // The next relay (once the dead one's session ran out) answers the intent again.
        let second = try RelayProcess.start(config: config)
        let records = try await readTopic(harness.cluster.bootstrapServers, invalidations, timeout: .seconds(60)) { _, total in total >= 1 }
        #expect(records.count == 1)
        let record = try #require(records.first)
        #expect(String(decoding: record.key ?? [], as: UTF8.self) == "com.example.app/\(gone)")
        let value = try #require(try JSONSerialization.jsonObject(with: Data(record.value)) as? [String: Any])
        #expect(value["unregistered_at"] as? Int == Int(unregisteredAt))
        #expect(value["intent_id"] as? String == "gone-1")
        #expect(try JSONSchemaCheck(docs: "invalidation.schema.json").problems(JSONValue(parsing: record.value)).isEmpty)
        try await waitUntil(timeout: .seconds(30), asking: { ((try? await Self.committed(harness)) ?? [:])[goneIndex] ?? 0 > 0 })
        #expect(await second.terminate() == 0)
        let log = try await harness.outcomeLog()
        let statuses = log.outcomes.filter { $0["status"] as? String != "invalid" }
            .map { "\($0["status"] as? String ?? "?")/\($0["original_status"] as? String ?? "-")" }
        #expect(statuses == ["unregistered/-", "duplicate/unregistered"])
        #expect(harness.simulator.answers == ["410 Unregistered": 1], "APNs asked once")

        // What the topic holds now, as the command prints it.
        let printed = try await RelayBinary.run(["invalidations", "--config", config, "--since", "1h"])
        #expect(printed.status == 0)
        let lines = printed.stdout.split(separator: "\n")
        #expect(lines.count == 1 && lines.first?.contains(#""token":"\#(gone)""#) == true, "\(printed.stdout)")
        let none = try await RelayBinary.run(["invalidations", "--config", config, "--since", "1h", "--timeout", "30s"],
                                             environment: ["APNS_RELAY_KAFKA_INVALIDATIONS_TOPIC": ""])
        #expect(none.status == 2, "no topic configured: \(none.stdout)")
        let bad = try await RelayBinary.run(["invalidations", "--config", config, "--since", "yesterday"])
        #expect(bad.status == 64, "a --since that is not a duration")
        await producer.close()
        await harness.simulator.stop()
    }

    /// What the relays' group committed, per partition of the intents topic (-1: nothing).
    static func committed(_ harness: ProcessHarness) async throws -> [Int: Int64] {
        let reader = try KafkaConsumer(bootstrapServers: harness.cluster.bootstrapServers, groupID: harness.group, topics: [])
        let committed = try await reader.committed((0..<4).map { TopicPartition(topic: harness.intentsTopic, partition: $0) })
        await reader.close()
        return Dictionary(uniqueKeysWithValues: committed.map { (Int($0.key.partition), $0.value) })
    }
}
