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

/// Why a Kafka message is not a usable intent. `reason` is a stable code for machines;
/// `message` says exactly what is wrong for people.
public struct InvalidIntent: Error, Sendable, Equatable {
    public var reason: String
    public var message: String
    /// The intent id, when the message had a usable one.
    public var id: String?
    /// The device token, when the message had one (else the Kafka key, if any, unless the
    /// message names a channel).
    public var token: String?
    public var topic: String?
    /// The channel, when the message names one (a string).
    public var channelID: String?
    /// The intent's `metadata` when it was a usable one (its outcome carries it all the same).
    public var metadata: [UInt8]?
    /// The intent's `redrive` when it was a usable one (its outcome carries it all the same).
    public var redrive: [UInt8]?

    public init(reason: String, message: String, id: String? = nil, token: String? = nil, topic: String? = nil,
                channelID: String? = nil, metadata: [UInt8]? = nil, redrive: [UInt8]? = nil) {
        self.reason = reason
        self.message = message
        self.id = id
        self.token = token
        self.topic = topic
        self.channelID = channelID
        self.metadata = metadata
        self.redrive = redrive
    }
}

extension Intent {
    /// Largest intent message accepted (the payload limit plus room for the envelope).
    public static let maxMessageBytes = 16 * 1024
    /// Largest `metadata`, in bytes of compact JSON.
    public static let maxMetadataBytes = 1024
    /// Largest `redrive`, in bytes of compact JSON.
    public static let maxRedriveBytes = 512

    /// Parses and validates one message value. `now` is epoch seconds; `defaultTTL` applies when
    /// the intent names no expiration.
    ///
    /// One pass over the bytes (``JSONReader``), no Foundation object tree: this runs for every
    /// consumed message. The payload is sent as given with its insignificant whitespace removed.
    public static func parse(_ value: [UInt8], key: [UInt8]?, now: Int64, defaultTTL: Int64) throws(InvalidIntent) -> Intent {
        let keyToken = key.map { String(decoding: $0, as: UTF8.self) }
        func invalid(_ reason: String, _ message: String, id: String? = nil, token: String? = nil, topic: String? = nil,
                     channelID: String? = nil, namesChannel: Bool = false) -> InvalidIntent {
            InvalidIntent(reason: reason, message: message, id: id, token: namesChannel ? token : token ?? keyToken, topic: topic,
                          channelID: channelID)
        }
        guard value.count <= maxMessageBytes else {
            throw invalid("MessageTooLarge", "intent is \(value.count) bytes, at most \(maxMessageBytes) allowed")
        }
        let fields: Fields
        switch value.withUnsafeBytes({ Fields.read($0) }) {
        case .success(let read): fields = read
        case .failure(.invalidUTF8(let offset)):
            throw invalid("InvalidUTF8", "intent holds a string that is not valid UTF-8 (at byte \(offset))")
        case .failure(.numberOutOfRange(let offset)):
            throw invalid("NotJSON", "intent holds a number out of range (at byte \(offset))")
        case .failure:
            throw invalid("NotJSON", "intent is not a JSON object")
        }
        let id = fields.string(.id)
        let token = fields.string(.token)
        let topic = fields.string(.topic)
        let channelID = fields.string(.channelID)
        let namesChannel = fields[.channelID] != nil
        // `metadata` and `redrive`: objects of at most their size once compacted; read first,
        // so that an outcome `invalid` for another reason carries them too.
        func object(_ field: Fields.Field, _ name: String, max: Int) -> (bytes: [UInt8]?, problem: String?) {
            guard let found = fields[field] else { return (nil, nil) }
            guard case .object(let range) = found else { return (nil, "\"\(name)\" must be a JSON object") }
            let compacted = value.withUnsafeBytes { Array(JSONReader.compacted(UnsafeRawBufferPointer(rebasing: $0[range])).readableBytesView) }
            guard compacted.count <= max else { return (nil, "\"\(name)\" is \(compacted.count) bytes, at most \(max) allowed") }
            return (compacted, nil)
        }
        let (metadata, metadataProblem) = object(.metadata, "metadata", max: maxMetadataBytes)
        let (redrive, redriveProblem) = object(.redrive, "redrive", max: maxRedriveBytes)
        func fail(_ reason: String, _ message: String) -> InvalidIntent {
            var failure = invalid(reason, message, id: id.flatMap { (1...128).contains($0.count) ? $0 : nil }, token: token, topic: topic,
                                  channelID: channelID, namesChannel: namesChannel)
            failure.metadata = metadata
            failure.redrive = redrive
            return failure
        }
        guard let id else {
            throw fail("MissingField", fields[.id] == nil ? "\"id\" is missing" : "\"id\" must be a string")
        }
        guard (1...128).contains(id.count) else {
            throw fail("BadId", "\"id\" must be 1 to 128 characters, got \(id.count)")
        }
        if namesChannel {
            guard fields[.token] == nil else {
                throw fail("TokenAndChannelId", "an intent names a device (\"token\") or a channel (\"channel_id\"), not both")
            }
            guard channelID != nil else { throw fail("BadChannelId", "\"channel_id\" must be a string") }
        } else if token == nil {
            throw fail("MissingField", fields[.token] == nil ? "\"token\" (or \"channel_id\") is missing" : "\"token\" must be a string")
        }
        guard let topic, !topic.isEmpty else {
            throw fail("MissingField", fields[.topic] == nil ? "\"topic\" is missing" : "\"topic\" must be a non-empty string")
        }
        // A bundle id (with its push type's suffix): ASCII letters, digits, dots, hyphens and
        // underscores. Nothing else, so that no topic can run into the next part of a Redis key
        // (":" separates them) or of a due-index member (" ").
        guard topic.utf8.allSatisfy(Self.isBundleIDByte) else {
            throw fail("BadTopic", "\"topic\" must be a bundle id: ASCII letters, digits, \".\", \"-\" and \"_\"")
        }
        if let metadataProblem { throw fail("BadMetadata", metadataProblem) }
        if let redriveProblem { throw fail("BadRedrive", redriveProblem) }
        guard let payloadValue = fields[.payload] else { throw fail("MissingField", "\"payload\" is missing") }
        guard case .object(let payloadRange) = payloadValue else { throw fail("BadPayload", "\"payload\" must be a JSON object") }

        var pushType = namesChannel ? PushType.liveactivity : .alert
        if let value = fields[.pushType] {
            guard case .string(let text) = value, let parsed = PushType(rawValue: text) else {
                throw fail("InvalidPushType", "\"push_type\" must be one of \(PushType.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            pushType = parsed
        }
        var priority = pushType.defaultPriority
        if let value = fields[.priority] {
            guard let parsed = value.exactInteger, let small = Int(exactly: parsed) else {
                throw fail("BadPriority", "\"priority\" must be an integer (10, 5 or 1)")
            }
            priority = small
        }
        var environment = APNsEnvironment.production
        if let value = fields[.environment] {
            guard case .string(let text) = value, let parsed = APNsEnvironment(rawValue: text) else {
                throw fail("BadEnvironment", "\"environment\" must be production or development")
            }
            environment = parsed
        }
        if pushType == .mdm, environment == .development {
            throw fail("BadEnvironment", "MDM pushes go to APNs production only")
        }
        var messageStoragePolicy: Int?
        if let value = fields[.messageStoragePolicy] {
            guard namesChannel else {
                throw fail("BadMessageStoragePolicy", "\"message_storage_policy\" is a channel's: it goes with \"channel_id\" only")
            }
            guard let parsed = value.exactInteger, parsed == 0 || parsed == 1 else {
                throw fail("BadMessageStoragePolicy", "\"message_storage_policy\" must be 0 (No Message Stored) or 1 (Most Recent Message Stored)")
            }
            messageStoragePolicy = Int(parsed)
        }
        // A No-Message-Stored channel takes expiration 0 only.
        var expiration = messageStoragePolicy == 0 ? 0 : now + defaultTTL
        if let value = fields[.expiration] {
            guard let parsed = value.exactInteger, (0...Self.latestExpiration).contains(parsed) else {
                throw fail("BadExpirationDate", "\"expiration\" must be epoch seconds up to the year 9999 (an integer, 0 for now-or-never)")
            }
            if messageStoragePolicy == 0, parsed != 0 {
                throw fail("BadExpirationDate", "a No-Message-Stored channel (message_storage_policy 0) takes expiration 0 only")
            }
            expiration = parsed
        }
        var collapseID: String?
        if let value = fields[.collapseID] {
            guard case .string(let text) = value else { throw fail("BadCollapseId", "\"collapse_id\" must be a string") }
            collapseID = text
        }
        if namesChannel {
            // A device's own state: a channel has none.
            if fields[.badge] != nil { throw fail("BadBadge", "\"badge\" counts a device's badge: it does not go with \"channel_id\"") }
            if fields[.tokenRegisteredAt] != nil {
                throw fail("BadTokenRegisteredAt", "\"token_registered_at\" is a device token's: it does not go with \"channel_id\"")
            }
        }
        var badge: BadgeChange?
        if let badgeValue = fields[.badge] {
            guard case .object(let range) = badgeValue,
                  let parsed = value.withUnsafeBytes({ BadgeChange.read(UnsafeRawBufferPointer(rebasing: $0[range])) }) else {
                throw fail("BadBadge", #""badge" must be {"increment": integer} or {"set": integer ≥ 0}, at most 1000000 in size"#)
            }
            badge = parsed
        }
        var tokenRegisteredAt: Int64?
        if let value = fields[.tokenRegisteredAt] {
            guard let parsed = value.exactInteger, (0...Self.latestExpiration * 1000).contains(parsed) else {
                throw fail("BadTokenRegisteredAt", "\"token_registered_at\" must be epoch milliseconds (an integer, 0 or more)")
            }
            tokenRegisteredAt = parsed
        }
        let payload = value.withUnsafeBytes { bytes in
            JSONReader.compacted(UnsafeRawBufferPointer(rebasing: bytes[payloadRange]))
        }
        // One device, one spelling: hex tokens are kept in lower case (APNs reads either).
        let intent = Intent(id: id, token: token?.lowercased() ?? "", topic: topic, pushType: pushType, priority: priority,
                            expiration: expiration, collapseID: collapseID, environment: environment, payload: payload,
                            badge: badge, tokenRegisteredAt: tokenRegisteredAt, channelID: channelID,
                            messageStoragePolicy: messageStoragePolicy, metadata: metadata, redrive: redrive)
        do {
            // Kept with the intent, marked checked: sent as it is, it is not checked again.
            intent.storage.notification = try intent.notification.validated()
        } catch {
            throw fail(error.code.rawValue, error.message)
        }
        return intent
    }

    /// The top-level members of an intent that the relay reads, each as the last value given.
    private struct Fields {
        package enum Field: Int, CaseIterable {
            case id, token, topic, payload, pushType, priority, environment, expiration, collapseID, badge, tokenRegisteredAt
            case channelID, messageStoragePolicy, metadata, redrive

            package init?(key: String) {
                switch key {
                case "id": self = .id
                case "token": self = .token
                case "topic": self = .topic
                case "payload": self = .payload
                case "push_type": self = .pushType
                case "priority": self = .priority
                case "environment": self = .environment
                case "expiration": self = .expiration
                case "collapse_id": self = .collapseID
                case "badge": self = .badge
                case "token_registered_at": self = .tokenRegisteredAt
                case "channel_id": self = .channelID
                case "message_storage_policy": self = .messageStoragePolicy
                case "metadata": self = .metadata
                case "redrive": self = .redrive
                default: return nil
                }
            }
        }

        private var values: [JSONReader.Value?] = Array(repeating: nil, count: Field.allCases.count)

        /// The fields, unless the bytes are not exactly one well-formed JSON object.
        package static func read(_ bytes: UnsafeRawBufferPointer) -> Result<Fields, JSONReader.Failure> {
            var fields = Fields()
            var reader = JSONReader(bytes)
            guard reader.nextIs(UInt8(ascii: "{")) else { return .failure(.malformed(offset: 0)) }
            do {
                try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                    if let field = Field(key: key) {
                        fields.values[field.rawValue] = try reader.readValue(depth: 1)
                    } else {
                        try reader.skipValue(depth: 1)
                    }
                }
                try reader.expectEnd()
            } catch {
                return .failure(error)
            }
            return .success(fields)
        }

        package subscript(field: Field) -> JSONReader.Value? { values[field.rawValue] }

        package func string(_ field: Field) -> String? {
            if case .string(let text)? = self[field] { return text }
            return nil
        }
    }
}
