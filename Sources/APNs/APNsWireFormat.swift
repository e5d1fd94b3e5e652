import Foundation
package import HTTP2
import NIOCore

/// APNs' wire format, as the client speaks it: a notification as an HTTP/2 request (to
/// `/3/device/<token>`, or for a broadcast to `/4/broadcasts/apps/<bundle id>`), and an answer
/// as an ``APNsResult``. Pure: no connection, no state.
extension APNsClient {
    /// The request for `notification` to `authority`, without its `authorization` header.
    package static func request(for notification: APNsNotification, apnsID: String, authority: String) -> HTTP2Request {
        if let channelID = notification.channelID {
            return broadcastRequest(notification, channelID: channelID, requestID: apnsID, authority: authority)
        }
        var headers = HTTP2Headers()
        headers.fields.reserveCapacity(8)
        // Never the same twice: indexed, each would take a place in both ends' HPACK tables
        // (allocated, and pushing out the topic and push type the next requests refer to).
        headers.addUnindexed("apns-id", apnsID)
        headers.add("apns-push-type", notification.pushType.rawValue)
        headers.add("apns-topic", notification.topic)
        headers.add("apns-priority", String(notification.effectivePriority))
        if let expiration = notification.expiration { headers.add("apns-expiration", String(expiration)) }
        if let collapseID = notification.collapseID { headers.add("apns-collapse-id", collapseID) }
        var request = HTTP2Request(method: "POST", scheme: "https", authority: authority,
                                   path: "/3/device/" + notification.deviceToken, headers: headers,
                                   body: notification.payload)
        request.precedence = notification.precedence
        return request
    }

    /// A broadcast on a channel: `POST /4/broadcasts/apps/<bundle id>`, the id as
    /// `apns-request-id`, no `apns-topic` (the bundle id is in the path).
    private static func broadcastRequest(_ notification: APNsNotification, channelID: String, requestID: String,
                                         authority: String) -> HTTP2Request {
        var headers = HTTP2Headers()
        headers.fields.reserveCapacity(7)
        headers.addUnindexed("apns-request-id", requestID)
        headers.add("apns-channel-id", channelID)
        headers.add("apns-push-type", PushType.liveactivity.rawValue)
        headers.add("apns-priority", String(notification.effectivePriority))
        headers.add("apns-expiration", String(notification.expiration ?? 0))
        var request = HTTP2Request(method: "POST", scheme: "https", authority: authority,
                                   path: "/4/broadcasts/apps/" + notification.topic, headers: headers, body: notification.payload)
        request.precedence = notification.precedence
        return request
    }

    /// Reads status, `apns-id` (`apns-request-id` for broadcasts), `apns-unique-id` and the JSON
    /// error body (`reason`, and `timestamp` on 410).
    package static func result(from response: HTTP2Response, apnsID: String, attempts: Int) -> APNsResult {
        let echoedID = response.headers["apns-id"] ?? response.headers["apns-request-id"] ?? apnsID
        guard response.status != 200 else {
            var result = APNsResult(status: 200, reason: nil, apnsID: echoedID, timestamp: nil, attempts: attempts)
            result.uniqueID = response.headers["apns-unique-id"]
            return result
        }
        var reason: APNsReason?
        var timestamp: Int64?
        if let body = response.body, body.readableBytes > 0, body.readableBytes < 64 * 1024,
           let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any] {
            if let text = object["reason"] as? String { reason = APNsReason(text) }
            if let number = object["timestamp"] as? NSNumber { timestamp = number.int64Value }
        }
        return APNsResult(status: response.status, reason: reason, apnsID: echoedID, timestamp: timestamp, attempts: attempts)
    }
}
