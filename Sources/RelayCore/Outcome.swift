import Common
/// What became of one intent: one event on the outcomes topic per intent (key = device token,
/// or channel id).
/// docs/outcomes.md describes it; docs/outcome.schema.json is its JSON Schema.
public struct Outcome: Sendable, Equatable {
    public enum Status: String, Sendable, CaseIterable {
        /// APNs accepted the notification.
        case delivered
        /// APNs refused it for good, or local validation did (reason says which).
        case rejected
        /// 410: the token is dead for this topic; `unregisteredAt` is APNs' timestamp.
        case unregistered
        /// The message itself is unusable (not JSON, missing field, bad token, payload too large).
        case invalid
        /// Its expiration passed before it could be sent.
        case expired
        /// Gave up: credential fault, no credentials, or the retry deadline passed.
        case failed
        /// APNs already answered this (topic, id) within the dedupe window, or a copy of it is
        /// in flight: not sent again.
        case duplicate
        /// A newer intent for the same device and app took its place before it could be sent
        /// (`supersededBy` names it): the same collapse id in one consumed batch, or a newer
        /// intent parked in the device's mailbox while this one waited there.
        case coalesced

        /// Its position among the statuses (0 ..< `allCases.count`), for counting by status
        /// without hashing its name.
        public var ordinal: Int {
            switch self {
            case .delivered: 0
            case .rejected: 1
            case .unregistered: 2
            case .invalid: 3
            case .expired: 4
            case .failed: 5
            case .duplicate: 6
            case .coalesced: 7
            }
        }
    }

    public var id: String?
    /// The device token (nil for a channel intent, and for a message that named neither).
    public var token: String?
    /// A channel intent's channel id.
    public var channelID: String?
    public var topic: String?
    public var status: Status
    public var httpStatus: Int?
    public var reason: String?
    /// `apns-id` (for a channel intent, `apns-request-id`).
    public var apnsID: String?
    /// `apns-unique-id` APNs gave an accepted broadcast (and, in development, a device push).
    public var apnsUniqueID: String?
    /// 410 only: when APNs last knew the token was invalid, ms since the epoch.
    public var unregisteredAt: Int64?
    /// For a `duplicate`: the status APNs' first answer gave it (`delivered`, `rejected`,
    /// `unregistered`), when the dedupe record says.
    public var originalStatus: String?
    /// The badge count sent in `aps.badge`, for intents that change it.
    public var badge: Int64?
    /// `coalesced` only: the id of the intent that took this one's place.
    public var supersededBy: String?
    /// Requests sent to APNs for this intent (0 when none was).
    public var attempts: Int
    /// From consuming the intent to deciding the outcome, in milliseconds.
    public var latencyMilliseconds: Int64
    /// The intents topic the intent came from (its lane, `kafka.lanes`).
    public var lane: String?
    public var partition: Int32
    public var offset: Int64
    public var worker: String
    /// When the outcome was decided, ms since the epoch.
    public var at: Int64
    /// The intent's `metadata` (a JSON object), as it came.
    public var metadata: [UInt8]?
    /// The intent's `collapse_id`, if it had one.
    public var collapseID: String?
    /// The intent's `redrive` (a JSON object): it was produced again by `apns-relay redrive`.
    public var redrive: [UInt8]?
    /// A priority-10 Live Activity update past its budget, sent at priority 5; nil otherwise.
    public var priorityDowngraded: Bool?
    /// With Redis, what the policy decided (`send`, `duplicate`, `park`, `coalesce`, `skip`);
    /// in shadow mode what enforce mode would have done. Nil without a decision.
    public var policyDecision: String?

    public init(id: String?, token: String?, topic: String?, status: Status, httpStatus: Int? = nil,
                reason: String? = nil, apnsID: String? = nil, unregisteredAt: Int64? = nil, attempts: Int = 0,
                latencyMilliseconds: Int64 = 0, lane: String? = nil, partition: Int32, offset: Int64, worker: String, at: Int64) {
        self.id = id
        self.token = token
        self.topic = topic
        self.status = status
        self.httpStatus = httpStatus
        self.reason = reason
        self.apnsID = apnsID
        self.unregisteredAt = unregisteredAt
        self.attempts = attempts
        self.latencyMilliseconds = latencyMilliseconds
        self.lane = lane
        self.partition = partition
        self.offset = offset
        self.worker = worker
        self.at = at
    }

    /// The event as published: version 1, every field present, unknown ones null.
    public var json: String { String(decoding: utf8, as: UTF8.self) }

    /// ``json`` as the UTF-8 bytes published.
    public var utf8: [UInt8] {
        // An outcome is about 580 bytes (a 64-character token, every optional field null), plus
        // its metadata and redrive objects as they came: one buffer, grown only for long
        // reasons, collapse ids or worker names.
        var writer = JSONObjectWriter(capacity: 768 + (metadata?.count ?? 0) + (redrive?.count ?? 0))
        writer.add("v", 1)
        writer.addOrNull("id", id)
        writer.addOrNull("token", token)
        writer.addOrNull("channel_id", channelID)
        writer.addOrNull("topic", topic)
        writer.add("status", status.rawValue)
        writer.addOrNull("original_status", originalStatus)
        writer.addOrNull("http_status", httpStatus)
        writer.addOrNull("reason", reason)
        writer.addOrNull("apns_id", apnsID)
        writer.addOrNull("apns_unique_id", apnsUniqueID)
        writer.addOrNull("unregistered_at", unregisteredAt)
        writer.addOrNull("badge", badge)
        writer.addOrNull("superseded_by", supersededBy)
        writer.addOrNull("policy_decision", policyDecision)
        if let priorityDowngraded { writer.addJSON("priority_downgraded", (priorityDowngraded ? "true" : "false").utf8) } else {
            writer.addNull("priority_downgraded")
        }
        writer.add("attempts", attempts)
        writer.add("latency_ms", latencyMilliseconds)
        writer.addOrNull("lane", lane)
        writer.add("partition", partition)
        writer.add("offset", offset)
        writer.add("worker", worker)
        writer.add("at", at)
        if let metadata { writer.addJSON("metadata", metadata) } else { writer.addOrNull("metadata", nil as String?) }
        writer.addOrNull("collapse_id", collapseID)
        if let redrive { writer.addJSON("redrive", redrive) } else { writer.addOrNull("redrive", nil as String?) }
        return writer.finish()
    }
}
