import Common
public import APNsCore
public import Foundation
public import NIOCore

/// A notification intent: one Kafka message on the intents topic (UTF-8 JSON, key = device
/// token or channel id). docs/intents.md describes it; docs/intent.schema.json is its JSON Schema.
///
/// It goes to one device (`token`) or, as a broadcast, to everyone subscribed to a channel
/// (`channel_id`, iOS 18 Live Activities): then ``token`` is empty, and of the per-device rules
/// dedupe applies, and the channels' own rate limit (see ``recipient``).
public struct Intent: Sendable {
    /// The last second of the year 9999: a parked intent's expiration is stored in Redis (a
    /// key's lifetime, in milliseconds) and read back, so later ones are refused as invalid.
    public static let latestExpiration: Int64 = 253_402_300_799

    /// The fields, shared by copies of an intent until one of them changes (copy on write):
    /// an intent is copied several times on its way, and a copy then costs one reference count
    /// instead of one per field.
    ///
    /// `@unchecked Sendable`: it is written only through ``writableStorage()``, which first makes
    /// it unique to the value writing, and by ``parse(_:key:now:defaultTTL:)`` before the intent
    /// it made is handed out; one that is shared is never written.
    @usableFromInline final class Storage: @unchecked Sendable {
        @usableFromInline var id: String
        @usableFromInline var token: String
        @usableFromInline var topic: String
        @usableFromInline var pushType: PushType
        @usableFromInline var priority: Int
        @usableFromInline var expiration: Int64
        @usableFromInline var collapseID: String?
        @usableFromInline var environment: APNsEnvironment
        @usableFromInline var payload: ByteBuffer
        @usableFromInline var badge: BadgeChange?
        @usableFromInline var tokenRegisteredAt: Int64?
        @usableFromInline var channelID: String?
        @usableFromInline var messageStoragePolicy: Int?
        @usableFromInline var metadata: [UInt8]?
        @usableFromInline var redrive: [UInt8]?
        /// The notification ``parse(_:key:now:defaultTTL:)`` checked (``APNsNotification/validated()``);
        /// nil once a field changed.
        @usableFromInline var notification: APNsNotification?

        init(id: String, token: String, topic: String, pushType: PushType, priority: Int, expiration: Int64,
             collapseID: String?, environment: APNsEnvironment, payload: ByteBuffer, badge: BadgeChange? = nil,
             tokenRegisteredAt: Int64? = nil, channelID: String? = nil, messageStoragePolicy: Int? = nil,
             metadata: [UInt8]? = nil, redrive: [UInt8]? = nil) {
            self.id = id
            self.token = token
            self.topic = topic
            self.pushType = pushType
            self.priority = priority
            self.expiration = expiration
            self.collapseID = collapseID
            self.environment = environment
            self.payload = payload
            self.badge = badge
            self.tokenRegisteredAt = tokenRegisteredAt
            self.channelID = channelID
            self.messageStoragePolicy = messageStoragePolicy
            self.metadata = metadata
            self.redrive = redrive
        }

        func copy() -> Storage {
            Storage(id: id, token: token, topic: topic, pushType: pushType, priority: priority, expiration: expiration,
                    collapseID: collapseID, environment: environment, payload: payload, badge: badge,
                    tokenRegisteredAt: tokenRegisteredAt, channelID: channelID, messageStoragePolicy: messageStoragePolicy,
                    metadata: metadata, redrive: redrive)
        }
    }

    @usableFromInline var storage: Storage

    public init(id: String, token: String, topic: String, pushType: PushType, priority: Int, expiration: Int64,
                collapseID: String?, environment: APNsEnvironment, payload: ByteBuffer, badge: BadgeChange? = nil,
                tokenRegisteredAt: Int64? = nil, channelID: String? = nil, messageStoragePolicy: Int? = nil,
                metadata: [UInt8]? = nil, redrive: [UInt8]? = nil) {
        storage = Storage(id: id, token: token, topic: topic, pushType: pushType, priority: priority, expiration: expiration,
                          collapseID: collapseID, environment: environment, payload: payload, badge: badge,
                          tokenRegisteredAt: tokenRegisteredAt, channelID: channelID, messageStoragePolicy: messageStoragePolicy,
                          metadata: metadata, redrive: redrive)
    }

    /// The storage, unique to this value, to change a field of: the checked notification no
    /// longer says what the intent holds.
    private mutating func writableStorage() -> Storage {
        if !isKnownUniquelyReferenced(&storage) { storage = storage.copy() }
        storage.notification = nil
        return storage
    }

    public var id: String {
        @inlinable get { storage.id }
        set { writableStorage().id = newValue }
    }
    /// The device token; empty for a channel intent.
    public var token: String {
        @inlinable get { storage.token }
        set { writableStorage().token = newValue }
    }
    public var topic: String {
        @inlinable get { storage.topic }
        set { writableStorage().topic = newValue }
    }
    public var pushType: PushType {
        @inlinable get { storage.pushType }
        set { writableStorage().pushType = newValue }
    }
    public var priority: Int {
        @inlinable get { storage.priority }
        set { writableStorage().priority = newValue }
    }
    /// Epoch seconds; 0 means now or never; at most ``latestExpiration``.
    public var expiration: Int64 {
        @inlinable get { storage.expiration }
        set { writableStorage().expiration = newValue }
    }
    public var collapseID: String? {
        @inlinable get { storage.collapseID }
        set { writableStorage().collapseID = newValue }
    }
    public var environment: APNsEnvironment {
        @inlinable get { storage.environment }
        set { writableStorage().environment = newValue }
    }
    /// The payload as it will be sent.
    public var payload: ByteBuffer {
        @inlinable get { storage.payload }
        set { writableStorage().payload = newValue }
    }
    /// A change to the device's badge count kept by the relay (needs Redis); the resulting
    /// count goes into `aps.badge` of the payload sent.
    public var badge: BadgeChange? {
        @inlinable get { storage.badge }
        set { writableStorage().badge = newValue }
    }
    /// When the app last registered this token, ms since the epoch, if the sender knows: with
    /// `policy.skip_known_unregistered`, an intent whose token APNs answered 410 for is sent
    /// only when this is newer than the 410's timestamp.
    public var tokenRegisteredAt: Int64? {
        @inlinable get { storage.tokenRegisteredAt }
        set { writableStorage().tokenRegisteredAt = newValue }
    }
    /// A broadcast's channel (base64, as APNs gave it at the channel's creation).
    public var channelID: String? {
        @inlinable get { storage.channelID }
        set { writableStorage().channelID = newValue }
    }
    /// The channel's message storage policy when the intent says it (0: No Message Stored,
    /// which takes expiration 0 only; 1: the most recent message stored).
    public var messageStoragePolicy: Int? {
        @inlinable get { storage.messageStoragePolicy }
        set { writableStorage().messageStoragePolicy = newValue }
    }
    /// The sender's own identifiers (a JSON object, compact, at most ``maxMetadataBytes``):
    /// never read by the relay, copied into every outcome of the intent and its invalidation
    /// record.
    public var metadata: [UInt8]? {
        @inlinable get { storage.metadata }
        set { writableStorage().metadata = newValue }
    }
    /// Set by `apns-relay redrive` on an intent it produced again (a JSON object, compact, at
    /// most ``maxRedriveBytes``: where the original was and when it was re-driven): copied into
    /// every outcome of the intent, which so names the re-drive.
    public var redrive: [UInt8]? {
        @inlinable get { storage.redrive }
        set { writableStorage().redrive = newValue }
    }

    /// What the relay keys its per-recipient state by: the device token, or `channel:<id>`
    /// for a channel intent (its device queue, its dedupe records and, with
    /// `policy.channels.rate_limit`, its bucket and mailbox; no token is ever spelled so, hex has
    /// no colon). Badges, 429 backoffs and remembered 410s are a device's and never apply to a
    /// channel.
    @inlinable public var recipient: String { channelID.map { Self.channelRecipientPrefix + $0 } ?? token }

    /// What starts a channel's ``recipient``.
    public static let channelRecipientPrefix = "channel:"

    /// The notification for APNs; its apns-id is derived from the intent id so that every
    /// attempt, in any process, carries the same one.
    ///
    /// A parsed intent's was checked when it was parsed (``APNsNotification/isValidated``), so
    /// that an APNs client does not check it again.
    public var notification: APNsNotification {
        if let checked = storage.notification { return checked }
        var notification = APNsNotification(deviceToken: token, topic: topic, pushType: pushType, priority: priority,
                                            expiration: expiration, collapseID: collapseID, apnsID: Intent.apnsID(for: id),
                                            payload: payload)
        notification.channelID = channelID
        return notification
    }

    package static func isBundleIDByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "."), UInt8(ascii: "-"), UInt8(ascii: "_"):
            true
        default:
            false
        }
    }

    /// The intent as an intents-topic message, every field explicit (the expiration resolved):
    /// how a parked intent is kept in its mailbox. ``parse(_:key:now:defaultTTL:)`` reads it back
    /// to the same intent.
    public var encoded: [UInt8] {
        var writer = JSONObjectWriter(capacity: 256 + payload.readableBytes)
        writer.add("id", id)
        if let channelID {
            writer.add("channel_id", channelID)
            writer.addIfPresent("message_storage_policy", messageStoragePolicy)
        } else {
            writer.add("token", token)
        }
        writer.add("topic", topic)
        writer.add("push_type", pushType.rawValue)
        writer.add("priority", priority)
        writer.add("expiration", expiration)
        writer.addIfPresent("collapse_id", collapseID)
        writer.add("environment", environment.rawValue)
        switch badge {
        case .increment(let n): writer.addJSON("badge", #"{"increment":\#(n)}"#.utf8)
        case .set(let n): writer.addJSON("badge", #"{"set":\#(n)}"#.utf8)
        case nil: break
        }
        writer.addIfPresent("token_registered_at", tokenRegisteredAt)
        if let metadata { writer.addJSON("metadata", metadata) }
        if let redrive { writer.addJSON("redrive", redrive) }
        writer.addJSON("payload", payload.readableBytesView)
        return writer.finish()
    }

    /// A UUID hashed from the intent id (FNV-1a in two lanes, marked as an RFC 9562 version 8
    /// UUID): stable across retries and processes, so APNs and its logs see one id per intent.
    public static func apnsID(for id: String) -> UUID {
        // FNV-1a over the id, two independent 64-bit lanes.
        var high: UInt64 = 0xcbf2_9ce4_8422_2325
        var low: UInt64 = 0x8422_2325_cbf2_9ce4
        for byte in id.utf8 {
            high = (high ^ UInt64(byte)) &* 0x0000_0100_0000_01B3
            low = (low ^ UInt64(byte)) &* 0x0000_0100_0000_01B3 &+ 0x9E37_79B9
        }
        return APNsIdentifiers.uuid(high: high, low: low, version: 8)
    }
}

/// `"badge": {"increment": n}` or `{"set": n}` in an intent.
public enum BadgeChange: Sendable, Equatable {
    /// Adds n (may be negative; the count never goes below 0).
    case increment(Int64)
    /// Sets the count to n (0 clears).
    case set(Int64)

    /// The largest count and step: APNs shows a badge as a number, and Redis' Lua numbers are
    /// doubles, so counts stay far from where they would lose precision.
    public static let limit: Int64 = 1_000_000

    /// Reads `{"increment": n}` or `{"set": n}` (exactly one member, an integer; set ≥ 0; both
    /// at most ``limit`` in size).
    package static func read(_ bytes: UnsafeRawBufferPointer) -> BadgeChange? {
        var reader = JSONReader(bytes)
        var members: [(String, JSONReader.Value)] = []
        do {
            try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                members.append((key, try reader.readValue(depth: 2)))
            }
        } catch {
            return nil
        }
        guard members.count == 1, let number = members[0].1.exactInteger, abs(number) <= limit else { return nil }
        switch members[0].0 {
        case "increment": return .increment(number)
        case "set" where number >= 0: return .set(number)
        default: return nil
        }
    }
}

/// Which APNs an intent goes to.
public enum APNsEnvironment: String, Sendable, CaseIterable {
    case production, development
}
