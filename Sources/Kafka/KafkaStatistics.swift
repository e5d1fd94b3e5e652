import Foundation

/// What the relay reads of librdkafka's statistics (emitted every `statistics.interval.ms`, as
/// JSON: librdkafka's STATISTICS.md): the brokers' connection state and round-trip time, the
/// producer's queue, and the fetch state of the consumer's assigned partitions.
public struct KafkaStatistics: Sendable, Equatable {
    public struct Broker: Sendable, Equatable {
        /// `host:port/nodeid`, as librdkafka names it.
        public var name: String
        /// `UP` while connected; `INIT`, `DOWN`, `CONNECT`, `AUTH`, `TRY_CONNECT`, ... else.
        public var state: String
        /// Average request round-trip time over the last interval.
        public var roundTripSeconds: Double
        /// Average time produced records waited in the producer's queue before being sent to
        /// this broker, over the last interval.
        public var queueLatencySeconds: Double

        public var isUp: Bool { state == "UP" }
    }

    public struct Partition: Sendable, Equatable {
        public var topic: String
        public var partition: Int32
        /// `active` while the consumer fetches it; `none`, `stopping`, `stopped`,
        /// `offset-query`, `offset-wait` else.
        public var fetchState: String
    }

    /// `producer` or `consumer`.
    public var type: String
    /// The brokers the client knows by node id (bootstrap-only entries are left out).
    public var brokers: [Broker]
    /// Records in the producer's queues, not yet acknowledged (`msg_cnt`).
    public var queuedMessages: Int
    /// The consumer's partitions that have a fetcher (assigned ones).
    public var partitions: [Partition]

    /// Parses librdkafka's statistics JSON; nil when it is not that.
    public init?(json: UnsafeRawBufferPointer) {
        guard let object = try? JSONSerialization.jsonObject(with: Data(json)) as? [String: Any] else { return nil }
        self.init(object)
    }

    init?(_ object: [String: Any]) {
        guard let type = object["type"] as? String else { return nil }
        func number(_ value: Any?) -> Double { (value as? NSNumber)?.doubleValue ?? 0 }
        self.type = type
        queuedMessages = Int(number(object["msg_cnt"]))
        brokers = ((object["brokers"] as? [String: Any]) ?? [:]).values.compactMap { value in
            // Brokers the cluster named (`learned`) or the settings did (`configured`), by node
            // id; not librdkafka's internal and logical ones (`GroupCoordinator`).
            guard let broker = value as? [String: Any], let name = broker["name"] as? String,
                  let nodeID = broker["nodeid"] as? NSNumber, nodeID.intValue >= 0,
                  !["internal", "logical"].contains(broker["source"] as? String ?? "") else { return nil }
            // Windowed figures in microseconds.
            let rtt = number((broker["rtt"] as? [String: Any])?["avg"]) / 1_000_000
            let latency = number((broker["int_latency"] as? [String: Any])?["avg"]) / 1_000_000
            return Broker(name: name, state: broker["state"] as? String ?? "", roundTripSeconds: rtt, queueLatencySeconds: latency)
        }.sorted { $0.name < $1.name }
        var partitions: [Partition] = []
        for (topicName, value) in (object["topics"] as? [String: Any]) ?? [:] {
            for (key, entry) in ((value as? [String: Any])?["partitions"] as? [String: Any]) ?? [:] {
                // -1 is librdkafka's internal "unassigned" partition.
                guard let number = Int32(key), number >= 0, let fields = entry as? [String: Any],
                      let state = fields["fetch_state"] as? String, state != "none" else { continue }
                partitions.append(Partition(topic: topicName, partition: number, fetchState: state))
            }
        }
        self.partitions = partitions.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) }
    }
}
