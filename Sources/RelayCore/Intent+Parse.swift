import APNsCore

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
        // The key stands in for a token the intent does not give: made only for an invalid one.
        func invalid(_ reason: String, _ message: String, id: String? = nil, token: String? = nil, topic: String? = nil,
                     channelID: String? = nil, namesChannel: Bool = false) -> InvalidIntent {
            InvalidIntent(reason: reason, message: message, id: id,
                          token: namesChannel ? token : token ?? key.map { String(decoding: $0, as: UTF8.self) }, topic: topic,
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
        // One device, one spelling: hex tokens are kept in lower case (APNs reads either). A token
        // in lower case already is kept as it is (`lowercased()` would copy it).
        let intent = Intent(id: id, token: token.map(Self.inLowerCase) ?? "", topic: topic, pushType: pushType, priority: priority,
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

    /// `text` in lower case: itself when it has no upper-case ASCII letter (no copy).
    private static func inLowerCase(_ text: String) -> String {
        var text = text
        let upper = text.withUTF8 { $0.contains { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") } }
        return upper ? text.lowercased() : text
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

        /// One per ``Field``, in place: an array would be an allocation per intent (and
        /// `InlineArray` needs macOS 26, where the package supports 15). Reached by position
        /// through a pointer: a tuple of one type is laid out as an array of it.
        private var values: (Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot, Slot) =
            (nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil)
        private typealias Slot = JSONReader.Value?
        private static let width = 15

        private init() {
            assert(Field.allCases.count == Self.width, "one value per field")
        }

        /// The fields, unless the bytes are not exactly one well-formed JSON object.
        package static func read(_ bytes: UnsafeRawBufferPointer) -> Result<Fields, JSONReader.Failure> {
            var fields = Fields()
            var reader = JSONReader(bytes)
            guard reader.nextIs(UInt8(ascii: "{")) else { return .failure(.malformed(offset: 0)) }
            do {
                try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                    if let field = Field(key: key) {
                        fields[field] = try reader.readValue(depth: 1)
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

        package subscript(field: Field) -> JSONReader.Value? {
            get {
                withUnsafePointer(to: values) {
                    $0.withMemoryRebound(to: Slot.self, capacity: Self.width) { $0[field.rawValue] }
                }
            }
            set {
                withUnsafeMutablePointer(to: &values) {
                    $0.withMemoryRebound(to: Slot.self, capacity: Self.width) { $0[field.rawValue] = newValue }
                }
            }
        }

        package func string(_ field: Field) -> String? {
            if case .string(let text)? = self[field] { return text }
            return nil
        }
    }
}
