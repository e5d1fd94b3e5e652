import APNs
import Common
import Crypto
import Foundation
package import HTTP2
package import NIOCore
import NIOSSL

/// One answer the simulator gives.
struct SimulatorAnswer: Error {
    var status: Int
    var reason: String?
    var timestamp: Int64?

    static let ok = SimulatorAnswer(status: 200)

    init(status: Int, reason: String? = nil, timestamp: Int64? = nil) {
        self.status = status
        self.reason = reason
        self.timestamp = timestamp
    }

    init(_ status: Int, _ reason: APNsReason) {
        self.init(status: status, reason: reason.description)
    }

    var key: String { reason.map { "\(status) \($0)" } ?? "\(status)" }
}

/// One client connection's APNs state: the provider token it uses, the team it is bound to,
/// how many streams it has sent. Event-loop confined.
final class SimulatorConnection: HTTP2ServerDelegate {
    let state: SharedState
    private let eventLoop: any EventLoop
    private var currentToken: String?
    private var currentIssuedAt: Int64 = 0
    private var tokenAcceptedAt: Int64 = 0
    private var boundTeam: String?
    private var currentKey: SimulatorConfiguration.SigningKey?
    private var streamsProcessed = 0
    var raisedLimit = false
    private var identifiers = APNsIdentifiers()
    /// With certificate auth: what the connection's client certificate says (nil: it could not
    /// be read), looked up on the first request.
    private var clientCertificate: APNsCertificateInfo??

    init(state: SharedState, eventLoop: any EventLoop) {
        self.state = state
        self.eventLoop = eventLoop
    }

    func handle(_ request: HTTP2Request, streamID: Int32, connection: HTTP2ServerHandler) {
        let apnsID = request.headers["apns-id"] ?? identifiers.next()
        switch state.disruption(apnsID: apnsID) {
        case .refuse?:
            return connection.resetStream(streamID, errorCode: HTTP2ErrorCode.refusedStream)
        case .dropConnection?:
            return connection.abort()
        case nil:
            break
        }
        if let response = channelResponse(request, connection: connection) {
            return connection.respond(streamID: streamID, response)
        }
        var accepted: AcceptedNotification?
        let early = check(request, apnsID: apnsID, connection: connection, accepted: &accepted)
        let settled = state.settle(early, openStreams: connection.openStreams) { accepted! }
        streamsProcessed += 1
        if let limit = settled.goAwayAfterStreams, streamsProcessed >= limit {
            connection.goAway(debugData: #"{"reason":"\#(settled.goAwayReason)"}"#)
        }
        if settled.blackHole { return }
        let response = Self.response(settled.answer, apnsID: apnsID)
        // Checked again under the lock that releases held answers, which may have run since.
        if settled.holdAnswers, state.hold({ $0.respond(streamID: streamID, response) }, for: connection, on: eventLoop) { return }
        if settled.latency > .zero {
            eventLoop.assumeIsolated().scheduleTask(in: settled.latency) {
                connection.respond(streamID: streamID, response)
            }
        } else {
            connection.respond(streamID: streamID, response)
        }
    }

    func connectionClosed(_ connection: HTTP2ServerHandler) {
        let violated = connection.failure != nil
        let peak = connection.peakConcurrentStreams
        let limitedToOne = !raisedLimit && !state.keys.isEmpty
        state.locked {
            $0.handlers[ObjectIdentifier(connection)] = nil
            $0.peakOverall = max($0.peakOverall, peak)
            if limitedToOne { $0.peakWhileLimitedToOne = max($0.peakWhileLimitedToOne, peak) }
            if violated { $0.protocolViolations += 1 }
        }
    }

    private static func response(_ answer: SimulatorAnswer, apnsID: String) -> HTTP2Response {
        guard answer.status != 200, let reason = answer.reason else {
            return HTTP2Response(status: answer.status, headers: HTTP2Headers([("apns-id", apnsID)]))
        }
        var json = #"{"reason":"\#(reason)""#
        if let timestamp = answer.timestamp { json += #","timestamp":\#(timestamp)"# }
        json += "}"
        return HTTP2Response(status: answer.status,
                             headers: HTTP2Headers([("apns-id", apnsID), ("content-type", "application/json")]),
                             body: ByteBuffer(string: json))
    }

    /// Checks the request in APNs' order (see ``APNsSimulator``); returns the first failure, or
    /// nil with `accepted` filled in when every header check passed.
    private func check(_ request: HTTP2Request, apnsID: String, connection: HTTP2ServerHandler,
                       accepted: inout AcceptedNotification?) -> SimulatorAnswer? {
        guard request.method == "POST" else { return SimulatorAnswer(405, .methodNotAllowed) }
        let prefix = "/3/device/"
        guard request.path.hasPrefix(prefix) else { return SimulatorAnswer(404, .badPath) }
        let token = String(request.path.dropFirst(prefix.count))
        if token.isEmpty { return SimulatorAnswer(400, .missingDeviceToken) }
        if token.utf8.contains(UInt8(ascii: "/")) || token.utf8.contains(UInt8(ascii: "?")) {
            return SimulatorAnswer(404, .badPath)
        }
        let headers = request.headers
        let fields = headers.fields
        for i in fields.indices {
            for j in fields.index(after: i)..<fields.endIndex where fields[i].name == fields[j].name {
                return SimulatorAnswer(400, .duplicateHeaders)
            }
        }

        var signingKey: SimulatorConfiguration.SigningKey?
        switch authorized(headers, connection: connection) {
        case .success(let key): signingKey = key
        case .failure(let answer): return answer
        }

        if let id = headers["apns-id"], !APNsIdentifiers.isCanonicalUUID(id) { return SimulatorAnswer(400, .badMessageId) }
        guard let topic = headers["apns-topic"], !topic.isEmpty else { return SimulatorAnswer(400, .missingTopic) }
        if let signingKey, !signingKey.topics.isEmpty, !signingKey.topics.contains(topic) {
            return SimulatorAnswer(400, .topicDisallowed)
        }
        var certificateSubject: String?
        if state.certificateAuth {
            // As APNs does: the certificate must be an APNs one, for this environment, and
            // name the topic (its UID or its topics extension).
            guard let info = certificate(of: connection), !info.topics.isEmpty else { return SimulatorAnswer(403, .badCertificate) }
            if let production = state.environment.isProduction, !info.allows(production: production) {
                return SimulatorAnswer(403, .badCertificateEnvironment)
            }
            guard info.topics.contains(topic) else { return SimulatorAnswer(400, .topicDisallowed) }
            certificateSubject = info.subject
        }
        var pushType = PushType.alert
        if let text = headers["apns-push-type"] {
            guard let parsed = PushType(rawValue: text) else { return SimulatorAnswer(400, .invalidPushType) }
            pushType = parsed
        }
        guard pushType.accepts(topic: topic) else { return SimulatorAnswer(400, .badTopic) }
        if (try? APNsNotification.validateDeviceToken(token)) == nil { return SimulatorAnswer(400, .badDeviceToken) }
        var priority = 10
        if let text = headers["apns-priority"] {
            guard let parsed = Int(text), [1, 5, 10].contains(parsed) else { return SimulatorAnswer(400, .badPriority) }
            priority = parsed
        }
        if pushType == .background, priority != 5 { return SimulatorAnswer(400, .badPriority) }
        var expiration: Int64?
        if let text = headers["apns-expiration"] {
            guard let parsed = Int64(text), parsed >= 0 else { return SimulatorAnswer(400, .badExpirationDate) }
            expiration = parsed
        }
        let collapseID = headers["apns-collapse-id"]
        if let collapseID, collapseID.utf8.count > 64 { return SimulatorAnswer(400, .badCollapseId) }
        let size = request.body?.readableBytes ?? 0
        if size == 0 { return SimulatorAnswer(400, .payloadEmpty) }
        if size > pushType.maxPayloadBytes { return SimulatorAnswer(413, .payloadTooLarge) }

        accepted = AcceptedNotification(
            deviceToken: token, topic: topic, apnsID: apnsID, pushType: pushType.rawValue, priority: priority,
            expiration: expiration, collapseID: collapseID,
            payload: state.recordsPayloads ? Array(request.body!.readableBytesView) : [],
            receivedAt: APNsIdentifiers.epochMilliseconds(), clientCertificate: certificateSubject)
        // APNs takes these in (200) and the device drops them: counted, as a device would.
        accepted?.droppedOnDevice = request.body!.withUnsafeReadableBytes { PushTypePayloads.problem(pushType, $0) }
        if pushType == .liveactivity {
            accepted?.liveActivityEvent = request.body!.withUnsafeReadableBytes { PushTypePayloads.liveActivityEvent($0) }
        }
        return nil
    }

    /// With signing keys configured, the request's provider token (``authorize(_:)``), and the
    /// connection's stream limit raised once one is valid, as APNs does (one stream until then).
    /// Nil without keys (certificate-style).
    func authorized(_ headers: HTTP2Headers, connection: HTTP2ServerHandler) -> Result<SimulatorConfiguration.SigningKey?, SimulatorAnswer> {
        guard !state.keys.isEmpty else { return .success(nil) }
        switch authorize(headers["authorization"]) {
        case .success(let key):
            if !raisedLimit {
                state.locked { $0.peakWhileLimitedToOne = max($0.peakWhileLimitedToOne, connection.peakConcurrentStreams) }
                raisedLimit = true
                connection.setMaxConcurrentStreams(state.maxConcurrentStreams)
            }
            return .success(key)
        case .failure(let answer):
            return .failure(answer)
        }
    }

    /// The connection's client certificate, read once.
    private func certificate(of connection: HTTP2ServerHandler) -> APNsCertificateInfo? {
        if let known = clientCertificate { return known }
        let peer = try? connection.channel?.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self).peerCertificate
        let info = peer.flatMap { try? APNsCertificateInfo($0) }
        clientCertificate = .some(info)
        return info
    }

    /// Verifies `bearer <JWT>`: known (team, key), valid ES256 signature, not older than the
    /// maximum age, same team as the connection's first token, and not a new token within 20
    /// minutes of the last one on this connection.
    private func authorize(_ header: String?) -> Result<SimulatorConfiguration.SigningKey, SimulatorAnswer> {
        guard let header, header.hasPrefix("bearer "), header.count > 7 else {
            return .failure(SimulatorAnswer(403, .missingProviderToken))
        }
        let now = state.clock()
        if header == currentToken, let currentKey {
            if now - currentIssuedAt > state.tokenMaxAge { return .failure(SimulatorAnswer(403, .expiredProviderToken)) }
            return .success(currentKey)
        }
        let jwt = header.dropFirst(7)
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = Base64URL.decode(parts[0]), let claimBytes = Base64URL.decode(parts[1]),
              let signatureBytes = Base64URL.decode(parts[2]),
              let jose = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
              let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any],
              jose["alg"] as? String == "ES256", let keyID = jose["kid"] as? String,
              let teamID = claims["iss"] as? String, let issuedAt = (claims["iat"] as? NSNumber)?.int64Value,
              let key = state.keys["\(teamID):\(keyID)"],
              let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes),
              key.publicKey.isValidSignature(signature, for: Array(jwt[..<parts[1].endIndex].utf8))
        else {
            return .failure(SimulatorAnswer(403, .invalidProviderToken))
        }
        if now - issuedAt > state.tokenMaxAge { return .failure(SimulatorAnswer(403, .expiredProviderToken)) }
        if let boundTeam, boundTeam != teamID { return .failure(SimulatorAnswer(403, .unrelatedKeyIdInToken)) }
        if currentToken != nil, now - tokenAcceptedAt < 20 * 60 {
            return .failure(SimulatorAnswer(429, .tooManyProviderTokenUpdates))
        }
        currentToken = header
        currentIssuedAt = issuedAt
        tokenAcceptedAt = now
        boundTeam = teamID
        currentKey = key
        return .success(key)
    }
}

extension APNsSimulator {
    /// The HTTP/2 handler one accepted connection runs. With signing keys a connection starts
    /// limited to one stream, raised once its first token is accepted (as APNs does).
    static func connectionHandler(state: SharedState, on eventLoop: any EventLoop) -> HTTP2ServerHandler {
        let initialStreams = state.keys.isEmpty ? state.maxConcurrentStreams : 1
        return HTTP2ServerHandler(maxConcurrentStreams: initialStreams,
                                  delegate: SimulatorConnection(state: state, eventLoop: eventLoop))
    }

    /// A connection handler with a simulator state of its own, for driving one connection with
    /// bytes directly (the fuzz targets do).
    package static func connectionHandler(_ configuration: SimulatorConfiguration,
                                          on eventLoop: any EventLoop) throws -> HTTP2ServerHandler {
        connectionHandler(state: try SharedState(configuration), on: eventLoop)
    }
}
