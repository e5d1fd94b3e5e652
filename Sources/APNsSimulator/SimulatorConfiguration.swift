public import Crypto
import Foundation
public import NIOCore
public import NIOSSL
import APNs

/// How the simulator behaves. Everything scriptable is also adjustable while it runs through
/// ``APNsSimulator/update(_:)``.
public struct SimulatorConfiguration: Sendable {
    /// A provider-token signing key the simulator accepts.
    public struct SigningKey: Sendable {
        public var teamID: String
        public var keyID: String
        public var publicKey: P256.Signing.PublicKey
        /// Topics this key may send to; empty means any (else 400 TopicDisallowed).
        public var topics: Set<String>

        public init(teamID: String, keyID: String, publicKey: P256.Signing.PublicKey, topics: Set<String> = []) {
            self.teamID = teamID
            self.keyID = keyID
            self.publicKey = publicKey
            self.topics = topics
        }

        /// Reads `TEAM_ID:KEY_ID:KEY_FILE`; the file is the `.p8` or its public key PEM.
        public init(parsing text: String) throws(SimulatorError) {
            let parts = text.split(separator: ":", maxSplits: 2).map(String.init)
            guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty else {
                throw .configuration("--jwt-key wants TEAM_ID:KEY_ID:KEY_FILE, got '\(text)'")
            }
            let pem: String
            do {
                pem = try String(contentsOfFile: parts[2], encoding: .utf8)
            } catch {
                throw .configuration("cannot read key file \(parts[2]): \(error)")
            }
            if let privateKey = try? P256.Signing.PrivateKey(pemRepresentation: pem) {
                self.init(teamID: parts[0], keyID: parts[1], publicKey: privateKey.publicKey)
            } else if let publicKey = try? P256.Signing.PublicKey(pemRepresentation: pem) {
                self.init(teamID: parts[0], keyID: parts[1], publicKey: publicKey)
            } else {
                throw .configuration("key file \(parts[2]) is neither a P-256 private key (.p8) nor a public key PEM")
            }
        }
    }

    /// What the simulator does beyond validating, all adjustable at run time.
    public struct Behaviour: Sendable {
        /// Tokens answered 410 Unregistered, with the millisecond timestamp to report.
        public var unregistered: [String: Int64] = [:]
        /// Budgets the device keeps for Live Activity pushes, as a device counts them (sliding
        /// windows, by arrival): priority-10 updates and ends per activity token per hour, starts
        /// per push-to-start token per `startWindow`. A push past one is answered 200, as APNs
        /// does, and counted in ``APNsSimulator/droppedOnDevice``; an `end` past the budget is
        /// taken (it ends the activity). Nil: no budget counted.
        public var liveActivityBudgets: (priority10PerHour: Int, startsPerWindow: Int, startWindow: TimeAmount)?
        /// Tokens bound to one topic; another topic gets 400 DeviceTokenNotForTopic.
        public var deviceTopics: [String: String] = [:]
        /// At most this many accepted notifications per device per `rateLimitWindow`; more get
        /// 429 TooManyRequests. Nil: no limit.
        public var rateLimitPerDevice: Int?
        public var rateLimitWindow: TimeAmount = .seconds(1)
        /// The fraction of otherwise good requests answered 500 or 503 (half each).
        public var failureRate: Double = 0
        /// Answer the next N otherwise good requests with this status: 500, 503, or 429
        /// (TooManyRequests, as past ``rateLimitPerDevice``).
        public var failNext: (count: Int, status: Int) = (0, 503)
        /// Send GOAWAY on a connection after it processed this many streams.
        public var goAwayAfterStreams: Int?
        /// The reason carried in scripted GOAWAYs.
        public var goAwayReason: String = "Shutdown"
        /// Delay before each answer.
        public var latency: TimeAmount = .zero
        /// Never answer at all (for deadline tests).
        public var blackHole: Bool = false
        /// Keep every answer (accepted and counted as usual, `latency` ignored) until
        /// ``APNsSimulator/releaseHeldAnswers()``: a test then knows which requests are at APNs
        /// at once, however slowly a loaded machine sends them. Turning it off with
        /// ``APNsSimulator/update(_:)`` holds no more answers and leaves those kept to the release.
        public var holdAnswers: Bool = false
        /// Reset the next N requests with RST_STREAM REFUSED_STREAM, unprocessed (outside any
        /// GOAWAY: a client may send them again).
        public var refuseNext: Int = 0
        /// Close the connection (no GOAWAY, no answer) on receiving each of the next N
        /// requests: the client cannot know whether APNs has them.
        public var dropConnectionOnNext: Int = 0

        public init() {}
    }

    public var host: String = "127.0.0.1"
    /// 0 picks a free port.
    public var port: Int = 0
    /// Keys whose tokens are accepted. Empty: no `authorization` is required (certificate-style).
    public var signingKeys: [SigningKey] = []
    /// Tokens older than this get 403 ExpiredProviderToken.
    public var tokenMaxAgeSeconds: Int64 = 3600
    /// MAX_CONCURRENT_STREAMS once a connection sent a request with a valid token (and from the
    /// start when no keys are configured). Token-auth connections start at 1, as APNs does.
    public var maxConcurrentStreams: UInt32 = 1000
    /// TLS certificate and key; a self-signed one for localhost is made when nil.
    public var tlsIdentity: (chain: [NIOSSLCertificate], key: NIOSSLPrivateKey)?
    /// Certificate auth: require a TLS client certificate issued by one of these (a handshake
    /// without one fails). Use with no `signingKeys`, as APNs' certificate connections carry no
    /// provider token.
    public var clientCertificateTrustRoots: [NIOSSLCertificate]?
    /// Which APNs environment this simulator is, for certificate auth: a client certificate
    /// marked for the other one only is answered 403 BadCertificateEnvironment.
    public var environment: Environment = .any
    /// Keep every accepted notification in memory (tests read them with ``APNsSimulator/accepted``).
    public var recordInMemory: Bool = true
    /// Append every accepted notification as one JSON line to this file.
    public var recordFile: String?
    /// Epoch seconds; injected by tests that age tokens.
    public var clock: @Sendable () -> Int64 = LocalProviderTokenSource.systemClock
    public var behaviour = Behaviour()

    public init() {}

    public enum Environment: String, Sendable, CaseIterable {
        /// Either: certificates are not checked for their environment.
        case any
        case production
        case development

        var isProduction: Bool? {
            switch self {
            case .any: nil
            case .production: true
            case .development: false
            }
        }
    }
}

public enum SimulatorError: Error, Sendable, CustomStringConvertible {
    case configuration(String)
    case startup(String)

    public var description: String {
        switch self {
        case .configuration(let why), .startup(let why): why
        }
    }
}

