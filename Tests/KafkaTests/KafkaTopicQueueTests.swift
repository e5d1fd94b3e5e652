import Foundation
import Kafka
import KafkaTesting
import Testing
import TestSupport

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

    /// Pauses and resumes asked from another thread while the poll thread takes from a topic
    /// queue lose nothing and repeat nothing: every partition's offsets arrive once each, without
    /// a gap. (librdkafka 2.0's batch call lost the records it had taken when a pause landed in
    /// the middle of it, which cannot happen now that the poll thread applies pauses between its
    /// turns; a pause during a partition's first offset lookup can make librdkafka read the
    /// partition again from its start, which the consumer skips: ``HandedOverOffsets``.)
    @Test func pausesFromAnotherThreadLoseNoRecord() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let bulk = uniqueName("bulk"), urgent = uniqueName("urgent")
        try cluster.createTopic(bulk, partitions: 4)
        try cluster.createTopic(urgent, partitions: 1)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let count = 12_000
        _ = try await producer.send(topic: bulk, records: (0..<count).map { (Array("k\($0)".utf8), [1]) })
        await producer.close()
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [urgent, bulk],
                                         properties: fastGroup.merging(["fetch.wait.max.ms": "10"]) { $1 },
                                         maxBatch: 500, topicQueues: true, outstandingPerTopic: 2000)
        let partitions = (0..<4).map { TopicPartition(topic: bulk, partition: Int32($0)) }
        let (messages, _) = try await withThrowingTaskGroup(of: ([KafkaMessage], [KafkaConsumerEvent])?.self) { group in
            group.addTask {
                try await collect(consumer, timeout: .seconds(60)) { messages, _ in
                    consumer.release(topic: bulk, records: messages.count)
                    return messages.count >= count
                }
            }
            // Pause and resume every partition over and over while they are read.
            group.addTask {
                while !Task.isCancelled {
                    consumer.pause(partitions)
                    // Long enough for the poll thread's turn to apply it, mostly.
                    try? await Task.sleep(for: .milliseconds(5))
                    consumer.resume(partitions)
                    try? await Task.sleep(for: .milliseconds(3))
                }
                return nil
            }
            let first = try await group.next()!
            group.cancelAll()
            return try #require(first)
        }
        for partition in partitions {
            let offsets = messages.filter { $0.topicPartition == partition }.map(\.offset)
            #expect(offsets == Array(0..<Int64(offsets.count)), "\(partition): \(offsets.count) records, first gap after \(zip(offsets, offsets.dropFirst()).first { $1 != $0 + 1 }.map { "\($0.0)" } ?? "-")")
        }
        #expect(messages.count == count)
        await consumer.close()
    }

    /// librdkafka keeps a partition paused across its unassignment: one the application paused
    /// when a rebalance took it must not come back paused.
    @Test func aPartitionRevokedWhilePausedComesBackUnpaused() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let (first, second, _, revoked) = try await KafkaRebalanceTests.rebalance(cluster, properties: fastGroup) { first, _ in
            first.pause(first.assignment)
            // Applied by the poll thread before the rebalance, so that the revocation has
            // paused partitions to resume.
            try await waitUntil { first.paused == Set(first.assignment) }
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

    /// A pause or resume asked by the application (from an event loop, say) returns without
    /// calling librdkafka, whose pause and resume wait for the partitions' broker threads
    /// without a deadline: the poll thread applies it on its next turn, and it holds from then.
    @Test func pausesAreAppliedByThePollThread() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("paused")
        try cluster.createTopic(topic, partitions: 2)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic],
                                         properties: fastGroup.merging(["fetch.wait.max.ms": "10"]) { $1 })
        let (p0, p1) = (TopicPartition(topic: topic, partition: 0), TopicPartition(topic: topic, partition: 1))
        _ = try await collect(consumer) { _, events in events.contains { if case .assigned = $0 { true } else { false } } }
        let turns = consumer.pausesApplied
        consumer.pause([p0])
        // Asked, not applied by the caller: only the poll thread pauses, once, on its turn.
        try await waitUntil { consumer.pausesApplied > turns }
        #expect(consumer.pausesApplied == turns + 1 && consumer.paused == [p0])
        for index in 0..<20 {
            _ = try await producer.send(topic: topic, partition: Int32(index % 2), key: Array("k\(index)".utf8), value: [1])
        }
        let (some, _) = try await collect(consumer) { messages, _ in messages.count >= 10 }
        #expect(some.count == 10 && some.allSatisfy { $0.topicPartition == p1 }, "\(some.map(\.topicPartition))")
        let resumed = consumer.pausesApplied
        consumer.resume([p0])
        let (rest, _) = try await collect(consumer) { messages, _ in messages.count >= 10 }
        #expect(rest.count == 10 && rest.allSatisfy { $0.topicPartition == p0 })
        #expect(consumer.pausesApplied == resumed + 1 && consumer.paused.isEmpty)
        await producer.close()
        await consumer.close()
    }
}
