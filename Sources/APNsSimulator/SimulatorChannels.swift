import APNs
import Foundation
import HTTP2
import NIOCore

/// A broadcast the simulator accepted (answered 200).
public struct AcceptedBroadcast: Sendable {
    public var bundleID: String
    public var channelID: String
    public var priority: Int
    public var expiration: Int64
    public var payload: [UInt8]
    /// The `apns-unique-id` it was answered with.
    public var uniqueID: String
}

/// Broadcast push on channels (iOS 18 Live Activities) and channel management, on the same
/// listener as device pushes, as the protocol document describes them:
///
/// - `POST /4/broadcasts/apps/<bundle id>`: 200 with `apns-request-id` and `apns-unique-id`, or
///   400 TopicDisallowed (a `.push-type.liveactivity` suffix), MissingChannelId, BadChannelId,
///   ChannelNotRegistered, MissingPushType, InvalidPushType (other than `liveactivity`, any
///   case), BadPriority (required: 10, 5 or 1), BadExpirationDate (required; only 0 on a
///   No-Message-Stored channel), PayloadEmpty, 413 PayloadTooLarge (over 5,120 bytes),
///   BadRequestPayload (no `aps` with `event` `update` or `end`, an integer `timestamp` and a
///   `content-state` object).
/// - `POST /1/apps/<bundle id>/channels` (201 with `apns-channel-id`; 400 BadRequestPayload
///   without `message-storage-policy` 0 or 1 and `push-type` `LiveActivity`, 400
///   CannotCreateChannelConfig past 10,000 channels), `GET` and `DELETE` of it with
///   `apns-channel-id` (200 with the channel's settings, 204), `GET /1/apps/<bundle id>/all-channels`
///   (200 `{"channels": [...]}`).
/// - Other methods 405 MethodNotAllowed, other paths 404 BadPath; with signing keys, the
///   provider token is checked first as for device pushes.
extension SimulatorConnection {
    static let maxChannelsPerApp = 10_000
    static let maxBroadcastPayload = 5_120

    /// The answer to a broadcast or channel management request; nil for any other path.
    func channelResponse(_ request: HTTP2Request, connection: HTTP2ServerHandler) -> HTTP2Response? {
        let path = request.path
        guard path.hasPrefix("/4/broadcasts/") || path.hasPrefix("/1/apps/") else { return nil }
        let requestID = request.headers["apns-request-id"] ?? UUID().uuidString.lowercased()
        func failure(_ status: Int, _ reason: String) -> HTTP2Response {
            state.locked { $0.answers["\(status) \(reason)", default: 0] += 1 }
            state.answered.update { $0 += 1 }
            return HTTP2Response(status: status, headers: HTTP2Headers([("apns-request-id", requestID), ("content-type", "application/json")]),
                                 body: ByteBuffer(string: #"{"reason":"\#(reason)"}"#))
        }
        if case .failure(let answer) = authorized(request.headers, connection: connection) {
            return failure(answer.status, answer.reason ?? "Forbidden")
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        // "/4/broadcasts/apps/<bundle>" and "/1/apps/<bundle>/channels" or "/all-channels".
        if parts.count == 5, parts[1] == "4", parts[2] == "broadcasts", parts[3] == "apps", !parts[4].isEmpty {
            guard request.method == "POST" else { return failure(405, "MethodNotAllowed") }
            return broadcast(request, bundleID: parts[4], requestID: requestID, failure: failure)
        }
        guard parts.count == 5, parts[1] == "1", parts[2] == "apps", !parts[3].isEmpty else { return failure(404, "BadPath") }
        let bundleID = parts[3]
        switch (parts[4], request.method) {
        case ("all-channels", "GET"):
            let ids = state.locked { ($0.channels[bundleID] ?? [:]).keys.sorted() }
            let body = (try? JSONSerialization.data(withJSONObject: ["channels": ids])) ?? Data()
            return HTTP2Response(status: 200, headers: HTTP2Headers([("apns-request-id", requestID), ("content-type", "application/json")]),
                                 body: ByteBuffer(bytes: body))
        case ("channels", "POST"):
            guard let body = request.body, body.readableBytes > 0,
                  let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any],
                  let policy = object["message-storage-policy"] as? Int, [0, 1].contains(policy),
                  object["push-type"] as? String == "LiveActivity" else { return failure(400, "BadRequestPayload") }
            let id = Self.newChannelID()
            let created = state.locked { state -> Bool in
                guard (state.channels[bundleID]?.count ?? 0) < Self.maxChannelsPerApp else { return false }
                state.channels[bundleID, default: [:]][id] = policy
                return true
            }
            guard created else { return failure(400, "CannotCreateChannelConfig") }
            return HTTP2Response(status: 201, headers: HTTP2Headers([("apns-request-id", requestID), ("apns-channel-id", id)]))
        case ("channels", "GET"), ("channels", "DELETE"):
            guard let id = request.headers["apns-channel-id"], !id.isEmpty else { return failure(400, "MissingChannelId") }
            guard Data(base64Encoded: id) != nil else { return failure(400, "BadChannelId") }
            let policy = state.locked { state -> Int? in
                let policy = state.channels[bundleID]?[id]
                if policy != nil, request.method == "DELETE" { state.channels[bundleID]?[id] = nil }
                return policy
            }
            guard let policy else { return failure(400, "ChannelNotRegistered") }
            if request.method == "DELETE" { return HTTP2Response(status: 204, headers: HTTP2Headers([("apns-request-id", requestID)])) }
            return HTTP2Response(status: 200, headers: HTTP2Headers([("apns-request-id", requestID), ("content-type", "application/json")]),
                                 body: ByteBuffer(string: #"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#))
        case ("channels", _), ("all-channels", _):
            return failure(405, "MethodNotAllowed")
        default:
            return failure(404, "BadPath")
        }
    }

    private func broadcast(_ request: HTTP2Request, bundleID: String, requestID: String,
                           failure: (Int, String) -> HTTP2Response) -> HTTP2Response {
        let headers = request.headers
        if bundleID.hasSuffix(PushType.liveactivity.topicSuffix) { return failure(400, "TopicDisallowed") }
        guard let channelID = headers["apns-channel-id"], !channelID.isEmpty else { return failure(400, "MissingChannelId") }
        guard Data(base64Encoded: channelID) != nil else { return failure(400, "BadChannelId") }
        guard let policy = state.locked({ $0.channels[bundleID]?[channelID] }) else { return failure(400, "ChannelNotRegistered") }
        guard let pushType = headers["apns-push-type"] else { return failure(400, "MissingPushType") }
        guard pushType.lowercased() == "liveactivity" else { return failure(400, "InvalidPushType") }
        guard let priority = headers["apns-priority"].flatMap({ Int($0) }), [10, 5, 1].contains(priority) else {
            return failure(400, "BadPriority")
        }
        guard let expiration = headers["apns-expiration"].flatMap({ Int64($0) }), expiration >= 0,
              policy == 1 || expiration == 0 else { return failure(400, "BadExpirationDate") }
        let size = request.body?.readableBytes ?? 0
        if size == 0 { return failure(400, "PayloadEmpty") }
        if size > Self.maxBroadcastPayload { return failure(413, "PayloadTooLarge") }
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body!.readableBytesView)) as? [String: Any],
              let aps = object["aps"] as? [String: Any], let event = aps["event"] as? String, ["update", "end"].contains(event),
              aps["timestamp"] is NSNumber, aps["content-state"] is [String: Any] else { return failure(400, "BadRequestPayload") }
        let uniqueID = UUID().uuidString.lowercased()
        let records = state.recordInMemory
        state.locked { state in
            state.delivered += 1
            if records {
                state.broadcasts.append(AcceptedBroadcast(bundleID: bundleID, channelID: channelID, priority: priority, expiration: expiration,
                                                          payload: Array(request.body!.readableBytesView), uniqueID: uniqueID))
            }
        }
        state.answered.update { $0 += 1 }
        return HTTP2Response(status: 200, headers: HTTP2Headers([("apns-request-id", requestID), ("apns-unique-id", uniqueID)]))
    }

    /// A channel id as APNs makes them: base64 of 16 random bytes.
    static func newChannelID() -> String {
        Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
    }
}
