import APNs
import NIOCore
public import Redis

/// What Redis holds about one device and app, for `apns-relay inspect` (read-only).
public struct DeviceRecords: Sendable {
    /// The last notification APNs accepted for the device and app.
    public struct LastSent: Sendable {
        public var token: String
        public var topic: String
        public var json: String
    }

    static let lastSentTTL = 7 * 86_400

    static func lastSentKey(token: String, topic: String) -> String { "apns-relay:last:{\(token)}:\(topic)" }

    static func lastSent(_ intent: Intent, _ notification: APNsNotification, apnsID: String?, at: Int64) -> LastSent {
        var writer = JSONObjectWriter(capacity: 256 + notification.payload.readableBytes)
        writer.add("id", intent.id)
        writer.addOrNull("apns_id", apnsID)
        writer.add("at", at)
        writer.add("payload", String(buffer: notification.payload))
        return LastSent(token: intent.token, topic: intent.topic, json: writer.json)
    }

    /// `{"id":…,"apns_id":…,"at":ms,"payload":"…"}` of the last notification APNs accepted, or nil.
    public var lastSentJSON: String?
    public var lastSentSecondsToLive: Int64?
    /// The badge count kept for server-side badges, or nil when none was ever set.
    public var badge: Int64?

    /// Reads the device's records in one round trip.
    public static func read(token: String, topic: String, from redis: RedisClient) async throws(RedisError) -> DeviceRecords {
        let last = lastSentKey(token: token, topic: topic)
        let replies = try await redis.pipeline([
            RedisCommand("GET", [last]), RedisCommand("TTL", [last]),
            RedisCommand("GET", [BadgeStore.countKey(token: token, topic: topic)]),
        ])
        for reply in replies { if case .error(let message) = reply { throw .server(message) } }
        return DeviceRecords(lastSentJSON: replies[0].string,
                             lastSentSecondsToLive: replies[0].isNull ? nil : replies[1].integer,
                             badge: replies[2].integer)
    }
}
