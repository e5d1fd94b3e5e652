import Kafka
import KafkaTesting
import Testing

@Suite("Kafka record headers", .timeLimit(.minutes(1)))
struct KafkaHeaderTests {
    /// Headers go out with their record and come back in order: a repeated name, an empty value
    /// and a null one included; a record without headers has none; the key may be absent.
    @Test func headersTravelWithTheirRecord() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("headers")
        try cluster.createTopic(topic, partitions: 1)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let headers = [
            KafkaHeader(name: "traceparent", value: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8)),
            KafkaHeader(name: "empty", value: []),
            KafkaHeader(name: "null", value: nil),
            KafkaHeader(name: "traceparent", value: Array("second".utf8)),
        ]
        _ = try await producer.send(topic: topic, key: Array("k".utf8), value: Array("with".utf8), headers: headers)
        _ = try await producer.send(topic: topic, key: nil, value: Array("keyless".utf8), headers: [KafkaHeader(name: "a", value: [1, 0, 2])])
        _ = try await producer.send(topic: topic, key: Array("k".utf8), value: Array("without".utf8))
        await producer.close()

        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic],
                                         properties: fastGroup)
        let (messages, _) = try await collect(consumer) { messages, _ in messages.count >= 3 }
        await consumer.close()
        #expect(messages.map { String(decoding: $0.value, as: UTF8.self) } == ["with", "keyless", "without"])
        #expect(messages[0].headers == headers)
        #expect(messages[0].header("traceparent")?.value == Array("second".utf8))
        #expect(messages[1].key == nil && messages[1].headers == [KafkaHeader(name: "a", value: [1, 0, 2])])
        #expect(messages[2].headers.isEmpty && messages[2].header("traceparent") == nil)
    }
}
