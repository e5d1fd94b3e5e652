public import Foundation
public import NIOCore

/// One push notification, as it goes to APNs.
///
/// Named `APNsNotification` rather than `Notification` so it never clashes with
/// `Foundation.Notification` in code that imports both.
public struct APNsNotification: Sendable {
    /// Hex of the device token (empty for a broadcast).
    public var deviceToken: String { didSet { isValidated = false } }
    /// For a broadcast on a channel (iOS 18 Live Activities): the channel id APNs gave at its
    /// creation (base64). The request then goes to `/4/broadcasts/apps/<topic>` with
    /// `apns-channel-id`, and ``apnsID`` goes out as `apns-request-id`.
    public var channelID: String? { didSet { isValidated = false } }
    /// `apns-topic`: the bundle id plus the push type's suffix; for a broadcast the plain
    /// bundle id (it goes in the path).
    public var topic: String { didSet { isValidated = false } }
    public var pushType: PushType { didSet { isValidated = false } }
    /// `apns-priority`: 10, 5 or 1; nil means the push type's default (5 for background, else 10).
    public var priority: Int? { didSet { isValidated = false } }
    /// `apns-expiration` in epoch seconds; 0 means deliver now or never; nil lets APNs store it.
    public var expiration: Int64? { didSet { isValidated = false } }
    /// `apns-collapse-id`, at most 64 bytes.
    public var collapseID: String? { didSet { isValidated = false } }
    /// `apns-id`. Generated once when the notification is made, so retries reuse it.
    public var apnsID: UUID
    /// The JSON payload, exactly as it is sent.
    public var payload: ByteBuffer { didSet { isValidated = false } }
    /// Among sends waiting for a stream on a connection, higher ones start first (0–3; the
    /// relay's priority lanes). Not sent to APNs.
    public var precedence: Int = 0
    /// ``validated()`` passed it, and nothing it checks has changed since (setting any of those
    /// fields clears it): ``APNsClient`` does not check it again.
    public private(set) var isValidated = false

    public init(deviceToken: String, topic: String, pushType: PushType = .alert, priority: Int? = nil,
                expiration: Int64? = nil, collapseID: String? = nil, apnsID: UUID? = nil, payload: ByteBuffer) {
        self.deviceToken = deviceToken
        self.topic = topic
        self.pushType = pushType
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID ?? APNsIdentifiers.randomUUID()
        self.payload = payload
    }

    /// A broadcast on a channel: push type `liveactivity`, and an expiration APNs requires (0:
    /// one attempt, not stored; the only one a No-Message-Stored channel accepts).
    public static func broadcast(channelID: String, bundleID: String, priority: Int = 10, expiration: Int64,
                                 apnsID: UUID? = nil, payload: ByteBuffer) -> APNsNotification {
        var notification = APNsNotification(deviceToken: "", topic: bundleID, pushType: .liveactivity, priority: priority,
                                            expiration: expiration, apnsID: apnsID, payload: payload)
        notification.channelID = channelID
        return notification
    }

    /// A plain alert: `{"aps":{"alert":text}}`.
    public static func alert(_ text: String, deviceToken: String, topic: String) -> APNsNotification {
        let json = try! JSONSerialization.data(withJSONObject: ["aps": ["alert": text]], options: [.sortedKeys])
        return APNsNotification(deviceToken: deviceToken, topic: topic, payload: ByteBuffer(bytes: json))
    }

    public var effectivePriority: Int { priority ?? pushType.defaultPriority }
}

/// Why a notification was refused before anything was sent. The codes follow APNs' reason names
/// where APNs has one, so a local refusal reads like the answer APNs would have given.
public struct APNsValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case badDeviceToken = "BadDeviceToken"
        case missingTopic = "MissingTopic"
        case badTopic = "BadTopic"
        case badPriority = "BadPriority"
        case badExpirationDate = "BadExpirationDate"
        case badCollapseId = "BadCollapseId"
        case payloadEmpty = "PayloadEmpty"
        case payloadTooLarge = "PayloadTooLarge"
        case badPayload = "BadPayload"
        case invalidPushType = "InvalidPushType"
        case missingChannelId = "MissingChannelId"
        case badChannelId = "BadChannelId"
        case topicDisallowed = "TopicDisallowed"
        case badRequestPayload = "BadRequestPayload"
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }
}

extension APNsNotification {
    /// This notification, checked (``validate()``) and marked so (``isValidated``): a client
    /// sends it without checking it again.
    public func validated() throws(APNsValidationError) -> APNsNotification {
        if isValidated { return self }
        try validate()
        var notification = self
        notification.isValidated = true
        return notification
    }

    /// Checks everything APNs would reject, in APNs' order, and throws the first problem.
    public func validate() throws(APNsValidationError) {
        if let channelID { return try validateBroadcast(channelID: channelID) }
        try Self.validateDeviceToken(deviceToken)
        if topic.isEmpty { throw APNsValidationError(.missingTopic, "topic is empty") }
        if !pushType.accepts(topic: topic) {
            throw APNsValidationError(
                .badTopic,
                pushType.topicSuffix.isEmpty
                    ? "topic '\(topic)' carries another push type's suffix; \(pushType.rawValue) pushes go to the bare bundle id"
                    : "push type \(pushType.rawValue) needs a topic ending in '\(pushType.topicSuffix)', got '\(topic)'")
        }
        if pushType == .mdm, !Self.isMDMTopic(topic) {
            throw APNsValidationError(.badTopic, "an MDM push goes to com.apple.mgmt.External.<UUID> (its push certificate's UID), got '\(topic)'")
        }
        let priority = effectivePriority
        guard [1, 5, 10].contains(priority) else {
            throw APNsValidationError(.badPriority, "priority \(priority) is not one of 10, 5, 1")
        }
        if pushType == .background, priority != 5 {
            throw APNsValidationError(.badPriority, "background pushes need priority 5, got \(priority)")
        }
        if let expiration, expiration < 0 {
            throw APNsValidationError(.badExpirationDate, "expiration \(expiration) is negative")
        }
        if let collapseID { try Self.validateCollapseID(collapseID) }
        try validatePayload()
    }

    /// `apns-collapse-id`: at most 64 bytes, and a valid HTTP/2 field value (RFC 9113 8.2.1: no
    /// CR, LF or NUL, no leading or trailing space or tab). Other control characters are refused
    /// too: such a header is cut or refused on the way (nghttp2, proxies) and the request reset,
    /// which would be retried until the intent expires.
    static func validateCollapseID(_ collapseID: String) throws(APNsValidationError) {
        let bytes = collapseID.utf8
        if bytes.count > 64 {
            throw APNsValidationError(.badCollapseId, "collapse id is \(bytes.count) bytes, at most 64 allowed")
        }
        if let control = bytes.first(where: { $0 < 0x20 || $0 == 0x7F }) {
            throw APNsValidationError(.badCollapseId, "collapse id holds the control character 0x\(String(control, radix: 16, uppercase: true))")
        }
        if let first = bytes.first, let last = bytes.last, first == 0x20 || last == 0x20 {
            throw APNsValidationError(.badCollapseId, "collapse id starts or ends with a space")
        }
    }

    /// Largest broadcast payload APNs accepts, in bytes.
    public static let maxBroadcastPayloadBytes = 5_120

    /// A broadcast, as APNs checks it (protocol doc, "Broadcast push on channels"): the plain
    /// bundle id, a base64 channel id, push type `liveactivity`, priority 10, 5 or 1, an
    /// expiration, no collapse id, and at most 5,120 bytes of payload whose `aps` holds `event`
    /// (`update` or `end`: a broadcast cannot start a Live Activity), an integer `timestamp`
    /// and a `content-state` object.
    private func validateBroadcast(channelID: String) throws(APNsValidationError) {
        if topic.isEmpty { throw APNsValidationError(.missingTopic, "topic (the bundle id) is empty") }
        if topic.hasSuffix(PushType.liveactivity.topicSuffix) {
            throw APNsValidationError(.topicDisallowed, "a broadcast goes to the plain bundle id, without \(PushType.liveactivity.topicSuffix)")
        }
        if channelID.isEmpty { throw APNsValidationError(.missingChannelId, "channel id is empty") }
        if Data(base64Encoded: channelID) == nil {
            throw APNsValidationError(.badChannelId, "channel id is not base64 (APNs gives it at the channel's creation)")
        }
        if pushType != .liveactivity {
            throw APNsValidationError(.invalidPushType, "broadcasts are liveactivity pushes, got \(pushType.rawValue)")
        }
        let priority = effectivePriority
        guard [1, 5, 10].contains(priority) else {
            throw APNsValidationError(.badPriority, "priority \(priority) is not one of 10, 5, 1")
        }
        guard let expiration, expiration >= 0 else {
            throw APNsValidationError(.badExpirationDate, "a broadcast needs an expiration (epoch seconds, 0 for one attempt)")
        }
        if collapseID != nil { throw APNsValidationError(.badCollapseId, "broadcasts carry no collapse id") }
        let size = payload.readableBytes
        if size == 0 { throw APNsValidationError(.payloadEmpty, "payload is empty") }
        if size > Self.maxBroadcastPayloadBytes {
            throw APNsValidationError(.payloadTooLarge, "payload is \(size) bytes, at most \(Self.maxBroadcastPayloadBytes) allowed for a broadcast")
        }
        if let problem = payload.withUnsafeReadableBytes(Self.broadcastPayloadProblem) {
            throw APNsValidationError(.badRequestPayload, problem)
        }
    }

    /// What is wrong with a broadcast payload, or nil.
    static func broadcastPayloadProblem(_ bytes: UnsafeRawBufferPointer) -> String? {
        var event: JSONReader.Value?, timestamp: JSONReader.Value?, contentState: JSONReader.Value?
        var aps: JSONReader.Value?
        do {
            try JSONReader.validate(bytes)
            var reader = JSONReader(bytes)
            guard reader.nextIs(UInt8(ascii: "{")) else { return "payload is not a JSON object" }
            try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                if key == "aps" { aps = try reader.readValue(depth: 1) } else { try reader.skipValue(depth: 1) }
            }
            guard case .object(let range)? = aps else { return "payload has no \"aps\" dictionary" }
            var inner = JSONReader(UnsafeRawBufferPointer(rebasing: bytes[range]))
            try inner.forEachMember { reader, key throws(JSONReader.Failure) in
                switch key {
                case "event": event = try reader.readValue(depth: 2)
                case "timestamp": timestamp = try reader.readValue(depth: 2)
                case "content-state": contentState = try reader.readValue(depth: 2)
                default: try reader.skipValue(depth: 2)
                }
            }
        } catch {
            return "payload is not valid JSON (\(error))"
        }
        guard case .string(let name)? = event, name == "update" || name == "end" else {
            return #"aps.event must be "update" or "end" (a broadcast cannot start a Live Activity)"#
        }
        guard timestamp?.exactInteger != nil else { return "aps.timestamp must be an integer (epoch seconds)" }
        guard case .object? = contentState else { return "aps.content-state must be an object" }
        return nil
    }

    /// `com.apple.mgmt.External.` and a UUID: the UID of an MDM push certificate.
    public static func isMDMTopic(_ topic: String) -> Bool {
        let prefix = "com.apple.mgmt.External."
        guard topic.hasPrefix(prefix) else { return false }
        return UUID(uuidString: String(topic.dropFirst(prefix.count))) != nil
    }

    /// Hex, even length, 64 to 200 characters.
    public static func validateDeviceToken(_ token: String) throws(APNsValidationError) {
        let count = token.utf8.count
        guard count >= 64, count <= 200, count % 2 == 0 else {
            throw APNsValidationError(.badDeviceToken, "device token must be 64 to 200 hex characters of even length, got \(count)")
        }
        // Over the contiguous bytes: iterating the UTF-8 view byte by byte was the larger part
        // of a notification's validation.
        var token = token
        guard token.withUTF8({ $0.allSatisfy(isHexDigit) }) else {
            throw APNsValidationError(.badDeviceToken, "device token is not hex")
        }
    }

    private func validatePayload() throws(APNsValidationError) {
        let size = payload.readableBytes
        if size == 0 { throw APNsValidationError(.payloadEmpty, "payload is empty") }
        if size > pushType.maxPayloadBytes {
            throw APNsValidationError(.payloadTooLarge, "payload is \(size) bytes, at most \(pushType.maxPayloadBytes) allowed for \(pushType.rawValue)")
        }
        let scanned = payload.withUnsafeReadableBytes { bytes -> Result<PayloadScanner.Summary, PayloadScanner.Failure> in
            do throws(PayloadScanner.Failure) {
                return .success(try PayloadScanner.scan(bytes, collectAPSKeys: pushType == .background, mdm: pushType == .mdm))
            } catch {
                return .failure(error)
            }
        }
        let summary: PayloadScanner.Summary
        switch scanned {
        case .success(let value): summary = value
        case .failure(.notAnObject): throw APNsValidationError(.badPayload, "payload is not a JSON object")
        case .failure(.tooDeep): throw APNsValidationError(.badPayload, "payload nests deeper than \(PayloadScanner.maximumDepth) levels")
        case .failure(.malformed(let offset)): throw APNsValidationError(.badPayload, "payload is not valid JSON (at byte \(offset))")
        case .failure(.invalidUTF8(let offset)): throw APNsValidationError(.badPayload, "payload is not valid UTF-8 (at byte \(offset))")
        case .failure(.numberOutOfRange(let offset)):
            throw APNsValidationError(.badPayload, "payload holds a number out of range (at byte \(offset))")
        }
        if pushType == .mdm {
            // Exactly {"mdm": "<PushMagic>"}: MDM pushes carry no aps.
            guard summary.mdmIsString, summary.topLevelMembers == 1 else {
                throw APNsValidationError(.badPayload, #"an MDM push's payload is exactly {"mdm": "<PushMagic>"}, with no "aps""#)
            }
            return
        }
        guard summary.aps == .object else {
            throw APNsValidationError(.badPayload, "payload has no \"aps\" dictionary")
        }
        if pushType == .background {
            let extra = summary.otherAPSKeys.sorted()
            if !extra.isEmpty {
                throw APNsValidationError(.badPayload, "a background push's aps may hold only content-available, found \(extra.joined(separator: ", "))")
            }
            if summary.contentAvailable != 1 {
                throw APNsValidationError(.badPayload, "a background push needs \"content-available\": 1 in aps")
            }
        }
        if pushType == .liveactivity || pushType == .widgets || pushType == .controls,
           let problem = payload.withUnsafeReadableBytes({ PushTypePayloads.problem(pushType, $0) }) {
            throw APNsValidationError(.badPayload, problem)
        }
    }
}

@inline(__always)
func isHexDigit(_ byte: UInt8) -> Bool {
    (byte >= 0x30 && byte <= 0x39) || (byte >= 0x61 && byte <= 0x66) || (byte >= 0x41 && byte <= 0x46)
}
