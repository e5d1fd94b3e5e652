import Common
import CRdKafka
import Foundation
import Spawn
import Glibc
public import Kafka
import Synchronization

/// librdkafka's in-process mock cluster: real Kafka protocol over loopback, brokers that can be
/// taken down and brought back, injected request errors. For tests, the demo and benchmarks.
/// `@unchecked Sendable`: librdkafka's mock API is thread-safe (it posts to the cluster's own
/// thread); its pointers are never changed after init, and `lastAnswered` is a `Locked`.
public final class KafkaMockCluster: @unchecked Sendable {
    /// The `rd_kafka_t` the cluster lives in (destroyed after it).
    private let owner: OpaquePointer
    private let cluster: OpaquePointer
    /// When the cluster's thread last answered a request (see ``command(_:)``).
    private let lastAnswered = Locked<ContinuousClock.Instant?>(nil)

    /// Kafka API keys for ``pushRequestErrors(apiKey:_:)``.
    public enum APIKey {
        public static let produce: Int16 = 0
        public static let fetch: Int16 = 1
        public static let offsetCommit: Int16 = 8
        public static let offsetFetch: Int16 = 9
        public static let findCoordinator: Int16 = 10
        public static let joinGroup: Int16 = 11
        public static let heartbeat: Int16 = 12
        public static let syncGroup: Int16 = 14
        public static let initProducerID: Int16 = 22
    }

    public init(brokers: Int = 3) throws(KafkaError) {
        // The cluster lives inside a client instance of its own.
        var errorText = [CChar](repeating: 0, count: 512)
        let conf = rd_kafka_conf_new()
        _ = rd_kafka_conf_set(conf, "log_level", "3", &errorText, errorText.count)
        guard let owner = rd_kafka_new(RD_KAFKA_PRODUCER, conf, &errorText, errorText.count) else {
            rd_kafka_conf_destroy(conf)
            throw KafkaError(code: RD_KAFKA_RESP_ERR__FAIL.rawValue,
                             message: "cannot start the mock Kafka cluster's client: \(string(fromCBuffer: errorText))")
        }
        guard let cluster = rd_kafka_mock_cluster_new(owner, Int32(brokers)) else {
            rd_kafka_destroy(owner)
            throw KafkaError(code: RD_KAFKA_RESP_ERR__FAIL.rawValue, message: "cannot start the mock Kafka cluster")
        }
        self.owner = owner
        self.cluster = cluster
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(owner)
    }

    /// Runs one request to the cluster's thread (librdkafka posts it and waits for the answer),
    /// one at a time and at least a millisecond after the previous one was answered.
    ///
    /// librdkafka 2.0.2's mock thread, woken by a byte on its wake-up pipe, serves its request
    /// queue and only then drains the pipe. A request posted in between, as the next one of a
    /// loop is, has its byte drained with the earlier one's and waits for the thread's next
    /// timer tick: up to a second per request (a loop of 3,000 took a second per round; with
    /// the pause, 2 ms). No event tells that the thread is back in its poll, hence the pause.
    private func command<Result>(_ request: () -> Result) -> Result {
        lastAnswered.withLock { lastAnswered in
            if let lastAnswered {
                let pause = lastAnswered + .milliseconds(1) - .now
                if pause > .zero { usleep(UInt32(pause.components.attoseconds / 1_000_000_000_000) + 1) }
            }
            defer { lastAnswered = .now }
            return request()
        }
    }

    /// `host:port,...` of the mock brokers.
    public var bootstrapServers: String {
        String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
    }

    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1) throws(KafkaError) {
        let error = command { rd_kafka_mock_topic_create(cluster, name, Int32(partitions), Int32(replicationFactor)) }
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(code: error.rawValue, message: "create topic \(name): \(String(cString: rd_kafka_err2str(error)))")
        }
    }

    /// Every request of this kind fails with `errorCode` until ``restoreRequests(apiKey:)``: an
    /// outage as clients see it, with the brokers still accepting connections (see
    /// ``setBroker(_:up:)`` for brokers that refuse them).
    public func failRequests(apiKey: Int16, errorCode: Int32) {
        // A stack deep enough to outlast any outage a test holds (clients retry at most every
        // few milliseconds); `restoreRequests` empties it.
        pushRequestErrors(apiKey: apiKey, Array(repeating: errorCode, count: 10_000))
    }

    /// Ends ``failRequests(apiKey:errorCode:)``, and drops any errors still pushed for that kind.
    public func restoreRequests(apiKey: Int16) {
        command { rd_kafka_mock_clear_request_errors(cluster, apiKey) }
    }

    /// The next requests of this kind that broker `broker` (1, 2, ...) gets are answered these
    /// errors, one each, in order, each after its delay; an error of 0 with a delay is a
    /// request the broker carries out and answers late (a client whose request timeout is
    /// shorter sends it again).
    public func pushBrokerRequestErrors(broker: Int32, apiKey: Int16, _ errors: [(code: Int32, delayMilliseconds: Int32)]) {
        for (code, delay) in errors {
            let result = command { apns_relay_mock_broker_push_error_rtt(cluster, broker, apiKey, rd_kafka_resp_err_t(rawValue: code), delay) }
            precondition(result == RD_KAFKA_RESP_ERR_NO_ERROR, "the mock cluster refused the injection: \(result)")
        }
    }

    /// Makes broker `broker` the leader of the partition.
    public func setLeader(topic: String, partition: Int32, broker: Int32) {
        let result = command { rd_kafka_mock_partition_set_leader(cluster, topic, partition, broker) }
        precondition(result == RD_KAFKA_RESP_ERR_NO_ERROR, "the mock cluster refused the leader: \(result)")
    }

    /// Takes a broker down (its connections are closed and new ones refused: librdkafka sees it
    /// `DOWN`), or back up.
    ///
    /// Taken down, librdkafka's mock broker closes its listener and binds its port again at
    /// once (to come back on it), and aborts the process if that bind fails. It fails while a
    /// child process this process is starting still holds a copy of the listener, so no child
    /// starts meanwhile (``ChildProcess/withoutChildrenStarting(_:)``). The request blocks (on
    /// the cluster's thread, and on a child being started), so it runs on a thread of its own.
    public func setBroker(_ broker: Int32, up: Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread {
                self.setBrokerBlocking(broker, up: up)
                continuation.resume()
            }.start()
        }
    }

    private func setBrokerBlocking(_ broker: Int32, up: Bool) {
        let result = command {
            ChildProcess.withoutChildrenStarting {
                up ? rd_kafka_mock_broker_set_up(cluster, broker) : rd_kafka_mock_broker_set_down(cluster, broker)
            }
        }
        precondition(result == RD_KAFKA_RESP_ERR_NO_ERROR, "the mock cluster refused to change broker \(broker): \(result)")
    }

    /// How many of ``pushBrokerRequestErrors(broker:apiKey:_:)``'s errors are still to come.
    public func brokerErrorsLeft(broker: Int32, apiKey: Int16) -> Int {
        var count = 0
        let result = command { rd_kafka_mock_broker_error_stack_cnt(cluster, broker, apiKey, &count) }
        precondition(result == RD_KAFKA_RESP_ERR_NO_ERROR, "the mock cluster cannot count broker \(broker)'s errors: \(result)")
        return count
    }

    /// The next requests of this kind get these errors, one each, in order.
    public func pushRequestErrors(apiKey: Int16, _ errorCodes: [Int32]) {
        let errors = errorCodes.map { rd_kafka_resp_err_t(rawValue: $0) }
        errors.withUnsafeBufferPointer { buffer in
            command { rd_kafka_mock_push_request_errors_array(cluster, apiKey, buffer.count, buffer.baseAddress) }
        }
    }
}

/// Broker error codes tests inject.
public enum KafkaErrorCode {
    public static let notLeaderForPartition = RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION.rawValue
    public static let requestTimedOut = RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT.rawValue
    public static let notEnoughReplicas = RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS.rawValue
    public static let coordinatorNotAvailable = RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE.rawValue
    public static let groupAuthorizationFailed = RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED.rawValue
}
