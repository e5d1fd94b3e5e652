import Common
import Foundation
import Kafka
import KafkaTesting
import Logging
@testable import Relay
import Testing

/// What the outcome publisher owns: its topic, its batched records' reports, the count by
/// status and the hook.
@Suite("Outcome publisher", .timeLimit(.minutes(2)))
struct OutcomePublisherTests {
    static func outcome(_ id: String, _ status: Outcome.Status) -> Outcome {
        Outcome(id: id, token: nil, topic: "com.example.app", status: status, reason: nil, attempts: 1, latencyMilliseconds: 3,
                lane: "intents", partition: 0, offset: 7, worker: "w", at: 0)
    }

    @Test func batchedRecordsReportTheirSlotsAndReachTheTopic() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = "outcomes-\(UUID().uuidString.prefix(8))"
        try cluster.createTopic(topic, partitions: 2)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let publisher = OutcomePublisher(producer: producer, topic: topic, logger: Logger(label: "test"), hook: nil)
        let slots = AsyncWatched<[Int]>([])
        publisher.deliverReports { reports in
            slots.update { $0 += reports.compactMap { (try? $0.result.get()) != nil ? $0.slot : nil } }
        }
        for slot in [3, 1 << 30] {
            publisher.sendBatched(key: Array("k\(slot)".utf8), value: Array("v\(slot)".utf8), headers: [], slot: slot)
        }
        try await publisher.send(key: nil, value: Array("awaited".utf8), headers: [])
        #expect(await slots.wait(atMost: .seconds(30)) { $0.count == 2 }, "both batched reports came")
        #expect(slots.value.sorted() == [3, 1 << 30])
        let messages = try await readTopic(cluster.bootstrapServers, topic, timeout: .seconds(30)) { _, total in total >= 3 }
        #expect(Set(messages.map { String(decoding: $0.value, as: UTF8.self) }) == ["v3", "v\(1 << 30)", "awaited"])
        await producer.close()
    }

    @Test func countsByStatusAndHandsEachToTheHook() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let heard = Locked<[String]>([])
        let publisher = OutcomePublisher(producer: producer, topic: "outcomes", logger: Logger(label: "test"),
                                         hook: { outcome in heard.withLock { $0.append(outcome.id ?? "") } })
        #expect(publisher.counts.isEmpty)
        publisher.counted(Self.outcome("a", .delivered))
        publisher.counted(Self.outcome("b", .delivered))
        publisher.counted(Self.outcome("c", .unregistered))
        #expect(publisher.counts == ["delivered": 2, "unregistered": 1])
        #expect(heard.withLock { $0 } == ["a", "b", "c"])
        await producer.close()
    }
}
