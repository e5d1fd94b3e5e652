import APNs
import APNsSimulator
import Crypto
import Foundation
import NIOCore
import Common
import TestSupport

/// A fixed team and key id, a fresh key pair per use.
struct TestKey {
    static let teamID = "TEAM123456"
    static let keyID = "ABC123DEFG"
    let privateKey = P256.Signing.PrivateKey()

    var signer: ProviderTokenSigner { ProviderTokenSigner(teamID: Self.teamID, keyID: Self.keyID, key: privateKey) }
    var simulatorKey: SimulatorConfiguration.SigningKey {
        SimulatorConfiguration.SigningKey(teamID: Self.teamID, keyID: Self.keyID, publicKey: privateKey.publicKey)
    }

    /// Writes the key as a `.p8` (PKCS#8 PEM) file and returns its path.
    func writeP8() throws -> String {
        let path = TestFiles.path("AuthKey_\(UUID().uuidString).p8").path
        try privateKey.pemRepresentation.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}

/// A clock tests move by hand (epoch seconds).
final class ManualClock: Sendable {
    private let now: Locked<Int64>
    init(_ start: Int64 = Int64(Date().timeIntervalSince1970)) { now = Locked(start) }
    var seconds: Int64 { now.withLock { $0 } }
    func advance(_ seconds: Int64) { now.withLock { $0 += seconds } }
    func set(_ seconds: Int64) { now.withLock { $0 = seconds } }
    var function: @Sendable () -> Int64 { { self.seconds } }
}

/// A clock that reads the given values in turn, then keeps reading the last one.
final class ScriptedClock: Sendable {
    private let readings: Locked<[Int64]>
    init(_ readings: [Int64]) { self.readings = Locked(readings) }
    var function: @Sendable () -> Int64 {
        { self.readings.withLock { $0.count > 1 ? $0.removeFirst() : $0[0] } }
    }
}

let sampleToken = String(repeating: "ab", count: 32)
let sampleTopic = "com.example.app"

func token(_ n: Int) -> String {
    let hex = String(n, radix: 16)
    return String(repeating: "0", count: 64 - hex.count) + hex
}

/// A simulator with one signing key, and a client that trusts its certificate.
struct Harness {
    let key: TestKey
    let simulator: APNsSimulator
    let source: LocalProviderTokenSource
    let client: APNsClient

    static func start(
        connections: Int = 1,
        requestTimeout: TimeAmount = .seconds(10),
        configure: (inout SimulatorConfiguration) -> Void = { _ in },
        clientClock: (@Sendable () -> Int64)? = nil,
        configureClient: (inout APNsClientConfiguration) -> Void = { _ in }
    ) async throws -> Harness {
        let key = TestKey()
        var configuration = SimulatorConfiguration()
        configuration.signingKeys = [key.simulatorKey]
        configure(&configuration)
        let simulator = try await APNsSimulator.start(configuration)
        let source = try LocalProviderTokenSource(signer: key.signer, clock: clientClock ?? LocalProviderTokenSource.systemClock)
        var clientConfiguration = APNsClientConfiguration(
            endpoint: APNsEndpoint(host: "127.0.0.1", port: simulator.port), credential: .token(source))
        clientConfiguration.connections = connections
        clientConfiguration.requestTimeout = requestTimeout
        clientConfiguration.additionalTrustRoots = [simulator.certificate]
        configureClient(&clientConfiguration)
        let client = try APNsClient(configuration: clientConfiguration)
        return Harness(key: key, simulator: simulator, source: source, client: client)
    }

    func stop() async {
        await client.shutdown()
        await simulator.stop()
    }
}

extension APNsClient {
    /// ``send(_:)``, or when `byCallback` the send that hands its result to a closure.
    func send(_ notification: APNsNotification, byCallback: Bool) async throws -> APNsResult {
        guard byCallback else { return try await send(notification) }
        return try await withCheckedThrowingContinuation { continuation in
            send(notification) { continuation.resume(with: $0) }
        }
    }
}
