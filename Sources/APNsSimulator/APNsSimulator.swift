import APNs
import Crypto
import Foundation
import HTTP2
public import NIOCore
import NIOPosix
public import NIOSSL
import Synchronization
import X509
import SwiftASN1

/// A notification the simulator accepted (answered 200).
public struct AcceptedNotification: Sendable {
    public var deviceToken: String
    public var topic: String
    public var apnsID: String
    public var pushType: String
    public var priority: Int
    public var expiration: Int64?
    public var collapseID: String?
    public var payload: [UInt8]
    /// Milliseconds since the epoch.
    public var receivedAt: Int64
    /// With certificate auth: the subject (UID) of the connection's client certificate.
    public var clientCertificate: String? = nil
    /// Why a device would drop it although APNs took it in (a Live Activity, widget or
    /// controls payload that breaks ``PushTypePayloads``' rules); nil when it would not.
    public var droppedOnDevice: String? = nil
    /// A Live Activity push's `aps.event`.
    public var liveActivityEvent: String? = nil
}

/// An APNs look-alike: TLS + HTTP/2 (nghttp2, the same engine as the client) answering as the
/// protocol document says APNs does.
///
/// Requests are checked in this order, the first failure answering: `:method` POST (405
/// MethodNotAllowed); `:path` `/3/device/<token>` (404 BadPath, 400 MissingDeviceToken); no header
/// twice (400 DuplicateHeaders); with signing keys configured, the provider token (403
/// MissingProviderToken, InvalidProviderToken, ExpiredProviderToken, UnrelatedKeyIdInToken;
/// 429 TooManyProviderTokenUpdates for a second new token within 20 minutes on one connection);
/// `apns-id` (400 BadMessageId); `apns-topic` (400 MissingTopic, TopicDisallowed); with a client CA
/// (certificate auth), the connection's certificate: 403 BadCertificate when it names no topic,
/// 403 BadCertificateEnvironment when it is for the other environment, 400 TopicDisallowed when
/// the topic is not its UID or in its topics extension; `apns-push-type`
/// (400 InvalidPushType) and the topic's suffix for it (400 BadTopic); the token's form (400
/// BadDeviceToken); `apns-priority` (400 BadPriority); `apns-expiration` (400 BadExpirationDate);
/// `apns-collapse-id` (400 BadCollapseId); the payload (400 PayloadEmpty, 413 PayloadTooLarge);
/// the token's binding to a topic (400 DeviceTokenNotForTopic); then the scripted behaviour: 410 Unregistered with a
/// timestamp, 429 TooManyRequests past the per-device rate, scripted 500/503; else 200.
public final class APNsSimulator: Sendable {
    public let port: Int
    /// The certificate clients must trust (self-signed unless one was configured).
    public let certificate: NIOSSLCertificate
    private let channel: any Channel
    private let group: any EventLoopGroup
    private let ownsGroup: Bool
    let state: SharedState

    /// Starts listening; `configuration.port` 0 picks a free port (see ``port``).
    public static func start(_ configuration: SimulatorConfiguration,
                             eventLoopGroup: (any EventLoopGroup)? = nil) async throws -> APNsSimulator {
        let identity = try configuration.tlsIdentity ?? {
            let made = try makeSelfSignedIdentity()
            return (made.chain, made.key)
        }()
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: identity.chain.map { .certificate($0) }, privateKey: .privateKey(identity.key))
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["h2"]
        if let roots = configuration.clientCertificateTrustRoots {
            // Certificate auth: a client must present a certificate these roots vouch for.
            tls.certificateVerification = .noHostnameVerification
            tls.trustRoots = .certificates(roots)
        }
        let sslContext = try NIOSSLContext(configuration: tls)
        let ownsGroup = eventLoopGroup == nil
        let group = eventLoopGroup ?? MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let state = try SharedState(configuration)
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let handler = connectionHandler(state: state, on: channel.eventLoop)
                        try channel.pipeline.syncOperations.addHandlers([NIOSSLServerHandler(context: sslContext), handler])
                        state.register(handler, on: channel.eventLoop)
                    }
                }
                .bind(host: configuration.host, port: configuration.port)
                .get()
            guard let port = channel.localAddress?.port else {
                throw SimulatorError.startup("listening socket has no port")
            }
            return APNsSimulator(port: port, certificate: identity.chain[0], channel: channel, group: group,
                                 ownsGroup: ownsGroup, state: state)
        } catch {
            if ownsGroup { try? await group.shutdownGracefully() }
            throw SimulatorError.startup("cannot listen on \(configuration.host):\(configuration.port): \(error)")
        }
    }

    private init(port: Int, certificate: NIOSSLCertificate, channel: any Channel, group: any EventLoopGroup,
                 ownsGroup: Bool, state: SharedState) {
        self.port = port
        self.certificate = certificate
        self.channel = channel
        self.group = group
        self.ownsGroup = ownsGroup
        self.state = state
    }

    /// `https://127.0.0.1:PORT` (the configured host).
    public var url: String {
        let host = channel.localAddress?.ipAddress ?? "127.0.0.1"
        return "https://\(host.contains(":") ? "[\(host)]" : host):\(port)"
    }

    /// Every notification answered 200, in order (when recording in memory).
    public var accepted: [AcceptedNotification] { state.locked { $0.accepted } }

    /// Every broadcast answered 200, in order (when recording in memory).
    public var broadcasts: [AcceptedBroadcast] { state.locked { $0.broadcasts } }

    /// The broadcast channels of an app: channel id → message storage policy.
    public func channels(of bundleID: String) -> [String: Int] { state.locked { $0.channels[bundleID] ?? [:] } }

    /// Notifications answered 200 that a device would have dropped, by the rule they broke
    /// (``AcceptedNotification/droppedOnDevice``).
    public var droppedOnDevice: [String: Int] { state.locked { $0.droppedOnDevice } }

    /// Answers by `"200"` or `"STATUS Reason"`.
    public var answers: [String: Int] {
        state.locked { state in
            var answers = state.answers
            if state.delivered > 0 { answers["200"] = state.delivered }
            return answers
        }
    }

    /// Waits until the simulator has answered `count` requests in all (what ``answers`` sums:
    /// a request held unanswered by `blackHole` counts once its answer was chosen); false when
    /// `timeout` passed first.
    public func waitForAnswers(atLeast count: Int, within timeout: Duration) async -> Bool {
        await state.answered.wait(atMost: timeout) { $0 >= count }
    }

    /// Connections accepted so far.
    public var connectionsAccepted: Int { state.locked { $0.connectionsAccepted } }

    /// The most concurrent streams any connection had open while its limit was 1, and whether
    /// any client broke a stream limit (nghttp2 then closes its connection with PROTOCOL_ERROR).
    public var streamLimitReport: (peakWhileLimitedToOne: Int, peakOverall: Int, violations: Int) {
        state.locked { ($0.peakWhileLimitedToOne, $0.peakOverall, $0.protocolViolations) }
    }

    /// The apns-ids of requests reset with REFUSED_STREAM (`behaviour.refuseNext`) and of those
    /// whose connection was closed on them (`behaviour.dropConnectionOnNext`), in order.
    public var disrupted: (refused: [String], dropped: [String]) { state.locked { ($0.refused, $0.dropped) } }

    /// Advertises a new SETTINGS_MAX_CONCURRENT_STREAMS on every open connection.
    public func setMaxConcurrentStreamsAll(_ value: UInt32) {
        for (handler, loop) in state.liveHandlers() {
            loop.execute { handler.value.setMaxConcurrentStreams(value) }
        }
    }

    /// Changes the scripted behaviour.
    public func update(_ change: @Sendable (inout SimulatorConfiguration.Behaviour) -> Void) {
        state.locked { change(&$0.behaviour) }
    }

    /// Sends every answer `behaviour.holdAnswers` kept, and keeps no more.
    public func releaseHeldAnswers() {
        state.releaseHeld()
    }

    /// Sends GOAWAY on every open connection now.
    public func goAwayAll(reason: String? = nil) {
        let reason = reason ?? state.locked { $0.behaviour.goAwayReason }
        for (handler, loop) in state.liveHandlers() {
            loop.execute {
                handler.value.goAway(debugData: #"{"reason":"\#(reason)"}"#)
            }
        }
    }

    /// Stops listening and closes every connection.
    public func stop() async {
        try? await channel.close()
        for (handler, loop) in state.liveHandlers() {
            try? await loop.submit { handler.value.channel?.close(promise: nil) }.get()
        }
        state.closeRecordFile()
        if ownsGroup { try? await group.shutdownGracefully() }
    }

    /// A self-signed P-256 certificate for localhost, 127.0.0.1 and ::1: the simulator's default
    /// server identity, and a client identity for certificate-auth tests.
    public static func makeSelfSignedIdentity(commonName: String = "apns-relay simulator") throws -> SelfSignedIdentity {
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName { CommonName(commonName) }
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(365 * 86400),
            issuer: name, subject: name,
            extensions: try Certificate.Extensions {
                SubjectAlternativeNames([
                    .dnsName("localhost"),
                    .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1])),
                    .ipAddress(ASN1OctetString(contentBytes: ArraySlice([UInt8](repeating: 0, count: 15) + [1]))),
                ])
            },
            issuerPrivateKey: Certificate.PrivateKey(key))
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return SelfSignedIdentity(
            chain: [try NIOSSLCertificate(bytes: serializer.serializedBytes, format: .der)],
            key: try NIOSSLPrivateKey(bytes: Array(key.derRepresentation), format: .der),
            certificatePEM: try certificate.serializeAsPEM().pemString,
            privateKeyPEM: key.pemRepresentation)
    }
}

/// A certificate and its key, in NIOSSL's types and as PEM text.
public struct SelfSignedIdentity: Sendable {
    public let chain: [NIOSSLCertificate]
    public let key: NIOSSLPrivateKey
    public let certificatePEM: String
    public let privateKeyPEM: String

    /// Writes the certificate and the key as PEM files.
    public func writePEM(certificateFile: String, keyFile: String) throws {
        try certificatePEM.write(toFile: certificateFile, atomically: true, encoding: .utf8)
        try privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
    }
}
