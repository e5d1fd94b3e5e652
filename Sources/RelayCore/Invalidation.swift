import Common

/// A record on the invalidations topic (`kafka.invalidations_topic`): APNs said the token is
/// dead for the topic (a 410). Keyed `<topic>/<token>`; a later delivery to the same pair
/// publishes a tombstone (a null value) under the same key, so a compacted topic holds exactly
/// the pairs currently known dead. docs/invalidations.md describes the topic;
/// docs/invalidation.schema.json is the record's JSON Schema.
public struct Invalidation: Sendable, Equatable {
    public var token: String
    public var topic: String
    /// When APNs last knew the token was invalid (its 410's timestamp), ms since the epoch;
    /// the outcome's time when APNs gave none.
    public var unregisteredAt: Int64
    /// APNs' reason (`Unregistered`, `ExpiredToken`).
    public var reason: String
    public var apnsID: String?
    /// The intent whose answer this is.
    public var intentID: String?
    /// When the relay decided the outcome, ms since the epoch.
    public var at: Int64
    /// The intent's `metadata` (a JSON object), as it came.
    public var metadata: [UInt8]?

    public init(token: String, topic: String, unregisteredAt: Int64, reason: String, apnsID: String?, intentID: String?, at: Int64) {
        self.token = token
        self.topic = topic
        self.unregisteredAt = unregisteredAt
        self.reason = reason
        self.apnsID = apnsID
        self.intentID = intentID
        self.at = at
    }

    /// The reason of an intent answered from a remembered 410 (`policy.skip_known_unregistered`).
    public static let knownUnregisteredReason = "KnownUnregistered"

    /// The record's key: `<topic>/<token>`.
    public static func key(topic: String, token: String) -> String { "\(topic)/\(token)" }

    /// The record's value, version 1, every field present (unknown ones null).
    public var utf8: [UInt8] {
        var writer = JSONObjectWriter()
        writer.add("v", 1)
        writer.add("token", token)
        writer.add("topic", topic)
        writer.add("unregistered_at", unregisteredAt)
        writer.add("reason", reason)
        writer.addOrNull("apns_id", apnsID)
        writer.addOrNull("intent_id", intentID)
        writer.add("at", at)
        if let metadata { writer.addJSON("metadata", metadata) } else { writer.addOrNull("metadata", nil as String?) }
        return writer.finish()
    }

    public var json: String { String(decoding: utf8, as: UTF8.self) }

    /// What `outcome` changes on the invalidations topic, as the record to publish (a nil value
    /// is a tombstone), or nil when it says nothing about its token:
    /// - `unregistered` (410): the pair is dead;
    /// - `delivered`: the pair is alive (a tombstone, whether or not it was ever dead: the relay
    ///   keeps no list of dead pairs to check against, and a tombstone for a key the topic does
    ///   not hold is compacted away);
    /// - `duplicate` of either: the same again, since its first publishing may not have
    ///   happened (the relay stopped between the outcome and the record; at least once).
    /// Every other status (rejected, invalid, expired, failed, coalesced) says nothing, and so
    /// does an `unregistered` answer from a remembered 410 (`KnownUnregistered`, no request was
    /// made: the 410 itself published the record).
    public static func record(for outcome: Outcome) -> (key: [UInt8], value: [UInt8]?)? {
        guard let token = outcome.token, let topic = outcome.topic, outcome.reason != knownUnregisteredReason else { return nil }
        let status = outcome.status == .duplicate ? outcome.originalStatus.flatMap(Outcome.Status.init(rawValue:)) : outcome.status
        let key = Array(Self.key(topic: topic, token: token).utf8)
        switch status {
        case .unregistered?:
            var dead = Invalidation(token: token, topic: topic, unregisteredAt: outcome.unregisteredAt ?? outcome.at,
                                    reason: outcome.reason ?? "Unregistered", apnsID: outcome.apnsID, intentID: outcome.id,
                                    at: outcome.at)
            dead.metadata = outcome.metadata
            return (key, dead.utf8)
        case .delivered?:
            return (key, nil)
        default:
            return nil
        }
    }
}
