import Foundation
import Kafka
import KafkaTesting
import Testing

/// Topic queues (each topic's records taken only while the application keeps up with that
/// topic), and pauses that do not outlive a partition's assignment.
@Suite("Kafka topic queues and pauses", .timeLimit(.minutes(2)))
struct KafkaTopicQueueTests {
    @Test func aTopicTheApplicationIsBehindOnDoesNotHoldUpTheOthers() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let bulk = uniqueName("bulk"), urgent = uniqueName("urgent")
        try cluster.createTopic(bulk, partitions: 2)
        try cluster.createTopic(urgent, partitions: 2)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        _ = try await producer.send(topic: bulk, records: (0..<200).map { (Array("k\($0)".utf8), [1]) })
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [urgent, bulk],
                                         properties: fastGroup.merging(["fetch.wait.max.ms": "10"]) { $1 },
                                         topicQueues: true, outstandingPerTopic: 20)
        // Nothing of the bulk topic is released: 20 of its records at most are handed over.
        let (first, _) = try await collect(consumer) { messages, _ in messages.count >= 20 }
        #expect(first.count == 20 && first.allSatisfy { $0.topic == bulk })
        _ = try await producer.send(topic: urgent, records: (0..<5).map { (Array("u\($0)".utf8), [2]) })
        let (next, _) = try await collect(consumer) { messages, _ in messages.filter { $0.topic == urgent }.count >= 5 }
        #expect(next.filter { $0.topic == bulk }.isEmpty, "bulk records past the limit: \(next.filter { $0.topic == bulk }.count)")
        // Released, the bulk topic goes on, in order per partition.
        consumer.release(topic: bulk, records: 20)
        let (rest, _) = try await collect(consumer) { messages, _ in
            consumer.release(topic: bulk, records: messages.count)
            return messages.count >= 180
        }
        let all = first + rest
        #expect(all.count == 200)
        for partition in Set(all.map(\.partition)) {
            let offsets = all.filter { $0.partition == partition }.map(\.offset)
            #expect(offsets == Array(0..<Int64(offsets.count)), "partition \(partition): \(offsets)")
        }
        await producer.close()
        await consumer.close()
    }

    /// librdkafka keeps a partition paused across its unassignment: one the application paused
    /// when a rebalance took it must not come back paused.
    @Test func aPartitionRevokedWhilePausedComesBackUnpaused() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let (first, second, _, revoked) = try await KafkaTests.rebalance(cluster, properties: fastGroup) { first, _ in
            first.pause(first.assignment)
        }
        #expect(!revoked.isEmpty)
        // The second member leaves: its partitions come back to the first.
        await second.close()
        _ = try await collect(first) { _, events in
            let assigned = events.flatMap { if case .assigned(let p) = $0 { return p }; return [] }
            return Set(revoked).isSubset(of: Set(assigned))
        }
        let topic = try #require(revoked.first?.topic)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        _ = try await producer.send(topic: topic, records: (0..<40).map { (Array("n\($0)".utf8), [3]) })
        // The partitions that stayed are still paused; the ones that came back deliver.
        let (messages, _) = try await collect(first) { messages, _ in !messages.isEmpty }
        #expect(messages.allSatisfy { revoked.contains($0.topicPartition) }, "\(messages.map(\.topicPartition))")
        await producer.close()
        await first.close()
    }
}
