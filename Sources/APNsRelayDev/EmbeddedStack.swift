import Common
import APNs
import APNsSimulator
import Crypto
import Foundation
import Kafka
import Logging
import Relay
import KafkaTesting

/// Everything the relay needs, in this process: librdkafka's mock Kafka cluster with the intents
/// and outcomes topics, the APNs simulator with a fresh signing key, and a relay configuration
/// pointing at both. Used by `demo` and `bench e2e`.
struct EmbeddedStack {
    static let teamID = "TEAM123456"
    static let keyID = "ABC123DEFG"
    static let topic = "com.example.app"

    let cluster: KafkaMockCluster
    let simulator: APNsSimulator
    let configuration: RelayConfiguration
    let directory: URL

    static func start(partitions: Int = 8, simulator configure: (inout SimulatorConfiguration) -> Void = { _ in }) async throws -> EmbeddedStack {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("apns-relay-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let key = P256.Signing.PrivateKey()
        let keyFile = directory.appendingPathComponent("AuthKey_\(keyID).p8").path
        try key.pemRepresentation.write(toFile: keyFile, atomically: true, encoding: .utf8)

        let cluster = try KafkaMockCluster(brokers: 3)
        var configuration = RelayConfiguration()
        try cluster.createTopic(configuration.kafka.intentsTopic, partitions: partitions)
        try cluster.createTopic(configuration.kafka.outcomesTopic, partitions: partitions)

        var simulatorConfiguration = SimulatorConfiguration()
        simulatorConfiguration.signingKeys = [.init(teamID: teamID, keyID: keyID, publicKey: key.publicKey)]
        simulatorConfiguration.recordInMemory = false
        configure(&simulatorConfiguration)
        let simulator = try await APNsSimulator.start(simulatorConfiguration)

        configuration.kafka.brokers = cluster.bootstrapServers
        // The mock cluster rebalances on session timeouts only; keep them short.
        configuration.kafka.properties = ["session.timeout.ms": "6000", "heartbeat.interval.ms": "500"]
        configuration.apns.endpoint = simulator.url
        configuration.apns.insecureSkipVerify = true
        configuration.apns.credentials = [.init(teamID: teamID, keyID: keyID, keyFile: keyFile, topics: [topic])]
        configuration.retry.initialBackoffMilliseconds = 50
        configuration.retry.maxBackoffMilliseconds = 1000
        return EmbeddedStack(cluster: cluster, simulator: simulator, configuration: configuration, directory: directory)
    }

    /// Stops the simulator and removes the directory, unless `keepingFiles`.
    func stop(keepingFiles: Bool = false) async {
        await simulator.stop()
        if !keepingFiles { try? FileManager.default.removeItem(at: directory) }
    }

    static func token(_ n: Int) -> String {
        let hex = String(n, radix: 16)
        return String(repeating: "0", count: 64 - hex.count) + hex
    }
}
