/// One partition of one topic.
public struct TopicPartition: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public var description: String { "\(topic)[\(partition)]" }
}

/// One record header: a name and a value (nil for a null value).
public struct KafkaHeader: Sendable, Equatable {
    public var name: String
    public var value: [UInt8]?

    public init(name: String, value: [UInt8]?) {
        self.name = name
        self.value = value
    }
}

/// A consumed record, copied out of librdkafka's memory.
public struct KafkaMessage: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    /// Empty for a null value too (``hasNullValue`` tells them apart).
    public var value: [UInt8]
    /// The record's value is null: a tombstone, on a compacted topic.
    public var hasNullValue = false
    /// Milliseconds since the epoch, when the broker or producer set one.
    public var timestamp: Int64?
    /// The record's headers, in order (a name may repeat).
    public var headers: [KafkaHeader]

    public init(topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8], timestamp: Int64?,
                headers: [KafkaHeader] = []) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.timestamp = timestamp
        self.headers = headers
    }

    /// The last header named `name` (W3C trace context and most conventions read the last).
    public func header(_ name: String) -> KafkaHeader? {
        headers.last { $0.name == name }
    }

    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }
}

/// What the consumer reports, in the order it happened.
public enum KafkaConsumerEvent: Sendable {
    /// Records, in partition order within each partition.
    case messages([KafkaMessage])
    /// Partitions added to this consumer's assignment (cooperative: only the new ones).
    case assigned([TopicPartition])
    /// Partitions taken away; work for them must be finished or dropped without storing offsets
    /// (librdkafka refuses offsets for partitions no longer assigned).
    case revoked([TopicPartition])
    /// A consumer-level error librdkafka reported (it keeps retrying on its own).
    case error(KafkaError)
}
