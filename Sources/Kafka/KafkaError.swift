import CRdKafka

/// A librdkafka failure: its error code, its text, and whether trying again can help.
public struct KafkaError: Error, Sendable, Equatable, CustomStringConvertible {
    /// librdkafka's `rd_kafka_resp_err_t` (negative: client-side, positive: broker error codes).
    public var code: Int32
    public var message: String
    public var isRetriable: Bool
    public var isFatal: Bool

    public init(code: Int32, message: String, isRetriable: Bool = false, isFatal: Bool = false) {
        self.code = code
        self.message = message
        self.isRetriable = isRetriable
        self.isFatal = isFatal
    }

    init(_ error: rd_kafka_resp_err_t, context: String? = nil) {
        let text = String(cString: rd_kafka_err2str(error))
        self.init(code: error.rawValue, message: context.map { "\($0): \(text)" } ?? text,
                  isRetriable: KafkaError.retriableCodes.contains(error.rawValue))
    }

    /// A setting librdkafka refused.
    static func configuration(_ key: String, _ why: String) -> KafkaError {
        KafkaError(code: RD_KAFKA_RESP_ERR__INVALID_ARG.rawValue, message: "kafka setting '\(key)': \(why)")
    }

    /// The code of librdkafka's local queue-full error.
    public static let queueFullCode = RD_KAFKA_RESP_ERR__QUEUE_FULL.rawValue
    /// The code of librdkafka's local timed-out error (a call's deadline passed).
    public static let timedOutCode = RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue

    private static let retriableCodes: Set<Int32> = [
        RD_KAFKA_RESP_ERR__QUEUE_FULL.rawValue, RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue,
        RD_KAFKA_RESP_ERR__TRANSPORT.rawValue, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN.rawValue,
        RD_KAFKA_RESP_ERR__MSG_TIMED_OUT.rawValue, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT.rawValue,
        RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION.rawValue, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE.rawValue,
        RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS.rawValue, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND.rawValue,
        RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE.rawValue, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION.rawValue,
        RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE.rawValue, RD_KAFKA_RESP_ERR_NOT_COORDINATOR.rawValue,
    ]

    public var description: String { "\(message) (kafka error \(code))" }
}
