import CRdKafka
import Common
import Foundation
import Logging

/// What librdkafka's callbacks reach through the client's opaque pointer: at least a logger.
/// `@unchecked Sendable` (the compiler checks no class that may be subclassed): `logger` is a
/// `let` and `statistics` a `LockedFunction`; each subclass says what makes its own state safe.
class KafkaCallbackContext: @unchecked Sendable {
    let logger: Logger
    /// Hears librdkafka's statistics (``KafkaStatistics``), when set.
    let statistics = LockedFunction<@Sendable (KafkaStatistics) -> Void>()

    init(logger: Logger) {
        self.logger = logger
    }

    /// Installs the log and statistics callbacks and makes `self` the configuration's opaque
    /// pointer. Pass the same context to ``KafkaHandle/init(type:configuration:context:)``: the
    /// handle keeps it alive until `rd_kafka_destroy` returned (librdkafka's threads log while
    /// it shuts down).
    func install(on builder: KafkaConfigBuilder) {
        builder.withConf { conf in
            rd_kafka_conf_set_opaque(conf, Unmanaged.passUnretained(self).toOpaque())
            rd_kafka_conf_set_log_cb(conf, forwardLog)
            rd_kafka_conf_set_stats_cb(conf, forwardStatistics)
        }
    }
}

/// librdkafka's statistics (every `statistics.interval.ms`, from the thread that polls the
/// client), parsed and handed to the context's handler. Returns 0: librdkafka frees the JSON.
private let forwardStatistics: @convention(c) (OpaquePointer?, UnsafeMutablePointer<CChar>?, Int, UnsafeMutableRawPointer?) -> Int32 = { _, json, length, opaque in
    guard let json, let opaque else { return 0 }
    let context = Unmanaged<KafkaCallbackContext>.fromOpaque(opaque).takeUnretainedValue()
    guard let handler = context.statistics.current,
          let statistics = KafkaStatistics(json: UnsafeRawBufferPointer(start: json, count: length)) else { return 0 }
    handler(statistics)
    return 0
}

/// librdkafka's own log lines, into swift-log (syslog levels: 0–3 error, 4 warning, 5–6 info).
private let forwardLog: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = { rk, level, facility, text in
    guard let rk, let opaque = rd_kafka_opaque(rk) else { return }
    let context = Unmanaged<KafkaCallbackContext>.fromOpaque(opaque).takeUnretainedValue()
    let logLevel: Logger.Level = level <= 3 ? .error : level == 4 ? .warning : level <= 6 ? .info : .debug
    context.logger.log(level: logLevel, "\(text.map { String(cString: $0) } ?? "")", metadata: [
        "kafka.facility": "\(facility.map { String(cString: $0) } ?? "")",
    ])
}

/// Builds an `rd_kafka_conf_t`; owns it until ``KafkaHandle`` takes it over.
final class KafkaConfigBuilder {
    private var conf: OpaquePointer?

    init(_ properties: [String: String]) throws(KafkaError) {
        conf = rd_kafka_conf_new()
        // Sorted, so that errors come out in a stable order.
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
            try set(key, value)
        }
    }

    deinit {
        if let conf { rd_kafka_conf_destroy(conf) }
    }

    func set(_ key: String, _ value: String) throws(KafkaError) {
        var errorText = [CChar](repeating: 0, count: 512)
        let result = rd_kafka_conf_set(conf, key, value, &errorText, errorText.count)
        guard result == RD_KAFKA_CONF_OK else {
            throw .configuration(key, string(fromCBuffer: errorText))
        }
    }

    /// Lends the configuration for a callback setter.
    func withConf<R>(_ body: (OpaquePointer) -> R) -> R {
        body(conf!)
    }

    /// Hands the configuration over (rd_kafka_new owns it when it succeeds).
    fileprivate func take() -> OpaquePointer? {
        defer { conf = nil }
        return conf
    }

    fileprivate func giveBack(_ conf: OpaquePointer?) {
        self.conf = conf
    }
}

/// Owns one `rd_kafka_t` (producer or consumer); destroys it in `deinit`.
///
/// Lifetimes: the handle holds the callback context its C callbacks reach through the opaque
/// pointer, so the context outlives `rd_kafka_destroy` whichever thread drops the last
/// reference; topic handles hold the handle (librdkafka requires every topic to be destroyed
/// before its client).
///
/// `@unchecked Sendable`: `handle` and `context` are `let`s; librdkafka's `rd_kafka_t` is
/// thread-safe, and this class only hands the pointer out through ``withHandle(_:)`` and
/// destroys it in `deinit`.
final class KafkaHandle: @unchecked Sendable {
    private let handle: OpaquePointer
    /// Released only after `deinit` destroyed the client.
    private let context: KafkaCallbackContext?

    init(type: rd_kafka_type_t, configuration: KafkaConfigBuilder, context: KafkaCallbackContext?) throws(KafkaError) {
        var errorText = [CChar](repeating: 0, count: 512)
        let conf = configuration.take()
        guard let handle = rd_kafka_new(type, conf, &errorText, errorText.count) else {
            configuration.giveBack(conf)
            throw KafkaError(code: RD_KAFKA_RESP_ERR__INVALID_ARG.rawValue,
                             message: "cannot create the Kafka client: \(string(fromCBuffer: errorText))")
        }
        self.handle = handle
        self.context = context
    }

    deinit {
        rd_kafka_destroy(handle)
    }

    /// A topic handle for producing; it keeps this client alive.
    func topic(_ name: String) -> TopicHandle? {
        rd_kafka_topic_new(handle, name, nil).map { TopicHandle($0, client: self) }
    }

    /// The number of partitions of `topic`, asked of the cluster: a metadata request, blocking
    /// until `deadline`, asked again every 50 ms while the topic or its leaders are not known
    /// (a topic being created, a broker not reachable yet). The answer also fills librdkafka's
    /// metadata cache, so a producer knows the topic's leaders from then on.
    func partitionCount(of topic: String, deadline: ContinuousClock.Instant) throws(KafkaError) -> Int {
        guard let topicHandle = rd_kafka_topic_new(handle, topic, nil) else {
            throw KafkaError(rd_kafka_last_error(), context: "topic \(topic)")
        }
        defer { rd_kafka_topic_destroy(topicHandle) }
        while true {
            var metadata: UnsafePointer<rd_kafka_metadata>?
            var error = rd_kafka_metadata(handle, 0, topicHandle, &metadata, remainingMilliseconds(deadline))
            if error == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata {
                defer { rd_kafka_metadata_destroy(metadata) }
                let described = metadata.pointee.topic_cnt > 0 ? metadata.pointee.topics[0] : nil
                if let described, described.err == RD_KAFKA_RESP_ERR_NO_ERROR, described.partition_cnt > 0 {
                    return Int(described.partition_cnt)
                }
                error = described?.err ?? RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC
            }
            guard ContinuousClock.now < deadline else { throw KafkaError(error, context: "metadata of \(topic)") }
            usleep(50_000)
        }
    }

    func withHandle<R, E: Error>(_ body: (OpaquePointer) throws(E) -> R) throws(E) -> R {
        try body(handle)
    }
}

/// Copies a Swift list of partitions into a C list for the duration of `body`.
func withPartitionList<R>(_ partitions: [TopicPartition], offsets: [Int64]? = nil,
                          _ body: (UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> R) -> R {
    let list = rd_kafka_topic_partition_list_new(Int32(max(partitions.count, 1)))!
    defer { rd_kafka_topic_partition_list_destroy(list) }
    for (index, partition) in partitions.enumerated() {
        let element = rd_kafka_topic_partition_list_add(list, partition.topic, partition.partition)!
        if let offsets { element.pointee.offset = offsets[index] }
    }
    return body(list)
}

/// Reads a C partition list into Swift values.
func partitions(of list: UnsafePointer<rd_kafka_topic_partition_list_t>?) -> [TopicPartition] {
    guard let list, list.pointee.cnt > 0, let elements = list.pointee.elems else { return [] }
    return (0..<Int(list.pointee.cnt)).map { index in
        let element = elements[index]
        return TopicPartition(topic: element.topic.map { String(cString: $0) } ?? "", partition: element.partition)
    }
}

/// Text from a fixed-size C buffer (up to its first NUL).
package func string(fromCBuffer buffer: [CChar]) -> String {
    let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
    return String(decoding: bytes, as: UTF8.self)
}

/// librdkafka settings checked without making a client.
public enum KafkaSettings {
    /// Throws what librdkafka says of the first setting it refuses (an unknown name, a value it
    /// cannot read), in name order; makes no client and opens no connection.
    public static func validate(_ properties: [String: String]) throws(KafkaError) {
        _ = try KafkaConfigBuilder(properties)
    }
}
