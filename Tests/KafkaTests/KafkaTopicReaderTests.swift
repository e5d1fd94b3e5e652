import Foundation
import Kafka
import KafkaTesting
import Testing

@Suite("Topic reader: partitions assigned by hand, read to the end", .timeLimit(.minutes(1)))
struct KafkaTopicReaderTests {
    @Test func readsEveryPartitionToItsEndThenOnlyWhatCameLater() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("read")
        try cluster.createTopic(topic, partitions: 3)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        defer { Task { await producer.close() } }
        _ = try await producer.send(topic: topic, records: (0..<30).map { (Array("k\($0)".utf8), Array("v\($0)".utf8)) })
        let reader = try KafkaTopicReader(bootstrapServers: cluster.bootstrapServers, topic: topic)

        let first = try await reader.readToEnd(timeout: .seconds(20))
        #expect(first.count == 30)
        #expect(Set(first.map { String(decoding: $0.value, as: UTF8.self) }) == Set((0..<30).map { "v\($0)" }))
        #expect(Set(first.map(\.partition)).count > 1)
        // Its ends: one offset per record, per partition.
        let ends = try await reader.ends(timeout: .seconds(20))
        #expect(ends.count == 3 && ends.values.reduce(0, +) == 30)
        #expect(ends.allSatisfy { partition, end in Int64(first.filter { $0.partition == partition }.count) == end })
        // At the end already: nothing more, at once.
        #expect(try await reader.readToEnd(timeout: .seconds(20)).isEmpty)

        _ = try await producer.send(topic: topic, records: (30..<35).map { (Array("k\($0)".utf8), Array("v\($0)".utf8)) })
        let later = try await reader.read(timeout: .seconds(20)) { _, total in total >= 5 }
        #expect(later.map { String(decoding: $0.value, as: UTF8.self) }.sorted() == (30..<35).map { "v\($0)" }.sorted())
        await reader.close()
    }

    @Test func anEmptyTopicIsReadAtOnce() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("empty")
        try cluster.createTopic(topic, partitions: 2)
        let reader = try KafkaTopicReader(bootstrapServers: cluster.bootstrapServers, topic: topic)
        #expect(try await reader.readToEnd(timeout: .seconds(20)).isEmpty)
        await reader.close()
    }

    /// Not enough within the deadline: a timed-out error that says what was read, after the
    /// deadline and not long after it.
    @Test func notEnoughBeforeTheDeadlineIsATimeout() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("short")
        try cluster.createTopic(topic, partitions: 1)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        defer { Task { await producer.close() } }
        _ = try await producer.send(topic: topic, key: nil, value: Array("only".utf8))
        let reader = try KafkaTopicReader(bootstrapServers: cluster.bootstrapServers, topic: topic)
        let started = ContinuousClock.now
        let error = await #expect(throws: KafkaError.self) {
            _ = try await reader.read(timeout: .seconds(2)) { _, total in total >= 2 }
        }
        let elapsed = ContinuousClock.now - started
        #expect(error?.code == KafkaError.timedOutCode)
        #expect(error?.message.contains("1 records") == true, "\(String(describing: error))")
        #expect(elapsed >= .seconds(2) && elapsed < .seconds(10))
        await reader.close()
    }
}
