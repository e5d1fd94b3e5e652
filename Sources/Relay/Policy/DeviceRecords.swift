import Common
import Foundation
import APNs
import NIOCore
public import Redis

/// What Redis holds about one device and app, for `apns-relay inspect` (read-only).
public struct DeviceRecords: Sendable {
    /// The last notification APNs accepted for the device and app.
    public struct LastSent: Sendable {
        public var token: String
        public var topic: String
        /// `{"id":…,"apns_id":…,"at":ms,"payload":{…}}` as UTF-8.
        public var json: [UInt8]
    }

    static let lastSentTTL = 7 * 86_400

    static func lastSent(_ intent: Intent, _ notification: APNsNotification, apnsID: String?, at: Int64) -> LastSent {
        var writer = JSONObjectWriter(capacity: 256 + notification.payload.readableBytes)
        writer.add("id", intent.id)
        writer.addOrNull("apns_id", apnsID)
        writer.add("at", at)
        // The payload is compact JSON already: kept as it is (no escaping on the hot path).
        writer.addJSON("payload", notification.payload.readableBytesView)
        return LastSent(token: intent.token, topic: intent.topic, json: writer.finish())
    }

    /// The `at` (ms since the epoch) of a last-sent record, nil when it is not one.
    static func lastSentTime(_ json: [UInt8]) -> Int64? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(json)) as? [String: Any],
              let at = object["at"] as? Int else { return nil }
        return Int64(at)
    }

    /// `{"id":…,"apns_id":…,"at":ms,"payload":{…}}` of the last notification APNs accepted, or nil.
    public var lastSentJSON: String?
    public var lastSentSecondsToLive: Int64?
    /// The badge count kept for server-side badges, or nil when none was ever set.
    public var badge: Int64?

    /// An intent in the device's mailbox.
    public struct MailboxEntry: Sendable {
        public var id: String
        /// The intent as kept (an intents-topic message).
        public var intentJSON: String
        /// Epoch seconds.
        public var expiration: Int64
        /// Parked: when it may be sent (epoch ms). Being sent: when its claim's lease ends.
        public var at: Int64?
    }

    /// The intent waiting in the mailbox, if any.
    public var parked: MailboxEntry?
    /// The intent a relay took from the mailbox and is sending, if any.
    public var sending: MailboxEntry?

    /// The device's token bucket as stored: its theoretical arrival time (epoch ms, see
    /// ``DevicePolicy``); nil when the bucket is full (its key expired or was never written).
    public var bucketArrival: Int64?
    /// 429 backoff: until when (epoch ms) and how many times it doubled.
    public var backoffUntil: Int64?
    public var backoffLevel: Int64?
    /// APNs' timestamp of a remembered 410 for the pair (epoch ms), with
    /// `policy.skip_known_unregistered`.
    public var unregisteredAt: Int64?

    /// Tokens in the bucket at `now` (epoch ms) under `limit`: each interval the arrival time
    /// lies ahead of now is a token spent.
    public func tokens(at now: Int64, limit: RelayConfiguration.Policy.RateLimit) -> Double {
        guard let arrival = bucketArrival else { return Double(limit.burst) }
        return max(0, Double(limit.burst) - Double(max(arrival - now, 0)) / Double(limit.intervalMilliseconds))
    }

    /// Live Activity budgets the token spent (``LiveActivityPacer``): priority-10 updates in
    /// the last hour, push-to-starts in the last start window.
    public var priority10Spent = 0
    public var startsSpent = 0

    /// Reads the device's records in one round trip, from the keys under `keyPrefix`
    /// (`redis.key_prefix`); `startWindowSeconds`: the topic's `policy.live_activity.start_window_seconds`.
    public static func read(token: String, topic: String, keyPrefix: String = "apns-relay:", startWindowSeconds: Int64 = 3600,
                            now: Int64? = nil, from redis: RedisClient) async throws(RedisError) -> DeviceRecords {
        let keys = RedisKeys(prefix: keyPrefix), now = now ?? APNsIdentifiers.epochMilliseconds()
        func since(_ seconds: Int64) -> Int64 { now - seconds * 1000 - LiveActivityPacer.slackMilliseconds }
        let last = keys.lastSent(token: token, topic: topic)
        let replies = try await redis.pipeline([
            RedisCommand("GET", [last]), RedisCommand("TTL", [last]),
            RedisCommand("GET", [keys.badgeCount(token: token, topic: topic)]),
            RedisCommand("HMGET", [keys.mailbox(token: token, topic: topic), "pid", "p", "pe", "pd", "cid", "c", "ce", "cu"]),
            RedisCommand("GET", [keys.rate(token: token)]),
            RedisCommand("GET", [keys.backoff(token: token)]),
            RedisCommand("GET", [keys.unregistered(token: token, topic: topic)]),
            RedisCommand("ZCOUNT", [keys.budget(token: token, topic: topic, kind: LiveActivityPacer.Budget.priority10.rawValue), "(\(since(3600))", "+inf"]),
            RedisCommand("ZCOUNT", [keys.budget(token: token, topic: topic, kind: LiveActivityPacer.Budget.start.rawValue),
                                    "(\(since(startWindowSeconds))", "+inf"]),
        ])
        for reply in replies { if case .error(let message) = reply { throw .server(message) } }
        var records = DeviceRecords(lastSentJSON: replies[0].string,
                                    lastSentSecondsToLive: replies[0].isNull ? nil : replies[1].integer,
                                    badge: replies[2].integer)
        let mailbox = replies[3].array ?? []
        func entry(_ first: Int) -> MailboxEntry? {
            guard mailbox.count >= first + 4, let id = mailbox[first].string,
                  let bytes = mailbox[first + 1].bytes, let stored = DevicePolicy.Entry(bytes) else { return nil }
            return MailboxEntry(id: id, intentJSON: String(decoding: stored.message, as: UTF8.self),
                                expiration: stored.expiration, at: mailbox[first + 3].integer)
        }
        records.parked = entry(0)
        records.sending = entry(4)
        records.bucketArrival = replies[4].integer
        if let backoff = DeviceAdmission.Bucket.backoff(replies[5].string) {
            records.backoffUntil = backoff.until
            records.backoffLevel = backoff.level
        }
        records.unregisteredAt = replies[6].integer
        records.priority10Spent = replies[7].integer.map(Int.init) ?? 0
        records.startsSpent = replies[8].integer.map(Int.init) ?? 0
        return records
    }
}
