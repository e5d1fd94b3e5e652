import APNs
import NIOCore
import Testing

@Suite("Local validation", .timeLimit(.minutes(3)))
struct NotificationValidationTests {
    static let alert = ByteBuffer(string: #"{"aps":{"alert":"hi"}}"#)

    static func make(token: String = sampleToken, topic: String = sampleTopic, pushType: PushType = .alert,
                     priority: Int? = nil, expiration: Int64? = nil, collapseID: String? = nil,
                     payload: ByteBuffer = alert) -> APNsNotification {
        APNsNotification(deviceToken: token, topic: topic, pushType: pushType, priority: priority,
                         expiration: expiration, collapseID: collapseID, payload: payload)
    }

    /// A notification checked once is marked so (a client does not check it again); setting any
    /// field the check reads clears the mark, so what a client sends unchecked is what was checked.
    @Test func aCheckedNotificationIsMarkedUntilAFieldTheCheckReadsChanges() throws {
        #expect(!Self.make().isValidated)
        var checked = try Self.make().validated()
        #expect(checked.isValidated)
        checked.precedence = 3
        #expect(checked.isValidated)
        let changes: [(String, @Sendable (inout APNsNotification) -> Void)] = [
            ("token", { $0.deviceToken = "abcd" }), ("topic", { $0.topic = "" }), ("push type", { $0.pushType = .voip }),
            ("priority", { $0.priority = 7 }), ("expiration", { $0.expiration = -1 }), ("collapse id", { $0.collapseID = "a\nb" }),
            ("payload", { $0.payload = ByteBuffer(string: "hello") }), ("channel", { $0.channelID = "not base64!" }),
        ]
        for (field, change) in changes {
            var changed = checked
            change(&changed)
            #expect(!changed.isValidated, "\(field)")
            #expect(throws: APNsValidationError.self, "\(field)") { try changed.validated() }
        }
    }

    /// ASCII topics are compared as bytes; another as characters, as before: U+0600 (a
    /// prepended mark) joins the dot after it into one character, so that topic does not end
    /// with ".voip" as characters, although its bytes do.
    @Test func aTopicThatIsNotASCIIIsComparedByCharacters() {
        #expect(!PushType.voip.accepts(topic: "\u{0600}.voip"))
        #expect(PushType.voip.accepts(topic: "é.voip"))
        #expect(PushType.voip.accepts(topic: "com.example.app.voip"))
        #expect(!PushType.alert.accepts(topic: "com.example.app.voip"))
        #expect(!PushType.voip.accepts(topic: ".voip"))
    }

    static let cases: [(String, APNsNotification, APNsValidationError.Code)] = [
        ("short token", make(token: "abcd"), .badDeviceToken),
        ("63 hex characters", make(token: String(repeating: "a", count: 63)), .badDeviceToken),
        ("odd length 65", make(token: String(repeating: "a", count: 65)), .badDeviceToken),
        ("202 hex characters", make(token: String(repeating: "a", count: 202)), .badDeviceToken),
        ("not hex", make(token: String(repeating: "zz", count: 32)), .badDeviceToken),
        ("empty topic", make(topic: ""), .missingTopic),
        ("voip without suffix", make(topic: "com.example.app", pushType: .voip), .badTopic),
        ("alert to a voip topic", make(topic: "com.example.app.voip"), .badTopic),
        ("liveactivity suffix", make(topic: "com.example.app", pushType: .liveactivity), .badTopic),
        ("priority 7", make(priority: 7), .badPriority),
        ("background at 10", make(pushType: .background, priority: 10,
                                  payload: ByteBuffer(string: #"{"aps":{"content-available":1}}"#)), .badPriority),
        ("negative expiration", make(expiration: -1), .badExpirationDate),
        ("65-byte collapse id", make(collapseID: String(repeating: "c", count: 65)), .badCollapseId),
        // A header value may not hold CR, LF or NUL (RFC 9113 8.2.1): nghttp2 refuses the request.
        ("collapse id with CR LF", make(collapseID: "a\r\nx-injected: 1"), .badCollapseId),
        ("collapse id with LF", make(collapseID: "a\nb"), .badCollapseId),
        ("collapse id with NUL", make(collapseID: "a\u{0}b"), .badCollapseId),
        ("collapse id with a leading space", make(collapseID: " a"), .badCollapseId),
        ("empty payload", make(payload: ByteBuffer()), .payloadEmpty),
        ("4097-byte alert", make(payload: padded(4097)), .payloadTooLarge),
        ("5121-byte voip", make(topic: "com.example.app.voip", pushType: .voip, payload: padded(5121)), .payloadTooLarge),
        ("not JSON", make(payload: ByteBuffer(string: "hello")), .badPayload),
        ("JSON array", make(payload: ByteBuffer(string: "[1]")), .badPayload),
        ("no aps", make(payload: ByteBuffer(string: #"{"custom":1}"#)), .badPayload),
        ("aps not a dictionary", make(payload: ByteBuffer(string: #"{"aps":"x"}"#)), .badPayload),
        ("background with alert", make(pushType: .background,
                                       payload: ByteBuffer(string: #"{"aps":{"content-available":1,"alert":"x"}}"#)), .badPayload),
        ("background without content-available", make(pushType: .background,
                                                      payload: ByteBuffer(string: #"{"aps":{}}"#)), .badPayload),
        ("content-available not an integer", make(pushType: .background,
                                                  payload: ByteBuffer(string: #"{"aps":{"content-available":"1"}}"#)), .badPayload),
        ("trailing garbage", make(payload: ByteBuffer(string: #"{"aps":{}} x"#)), .badPayload),
        ("unterminated string", make(payload: ByteBuffer(string: #"{"aps":{"alert":"hi}}"#)), .badPayload),
        ("bad escape", make(payload: ByteBuffer(string: #"{"aps":{"alert":"\q"}}"#)), .badPayload),
        ("control character in a string", make(payload: ByteBuffer(string: "{\"aps\":{\"alert\":\"a\u{01}\"}}")), .badPayload),
        ("leading zero", make(payload: ByteBuffer(string: #"{"aps":{"badge":01}}"#)), .badPayload),
        ("missing comma", make(payload: ByteBuffer(string: #"{"aps":{"badge":1 "sound":"x"}}"#)), .badPayload),
        ("trailing comma", make(payload: ByteBuffer(string: #"{"aps":{"badge":1,}}"#)), .badPayload),
        ("bare word", make(payload: ByteBuffer(string: #"{"aps":{"badge":nope}}"#)), .badPayload),
        ("nested 100 deep", make(payload: ByteBuffer(string: #"{"aps":{},"x":"# + String(repeating: "[", count: 100)
                                                       + String(repeating: "]", count: 100) + "}")), .badPayload),
    ]

    static func padded(_ size: Int) -> ByteBuffer {
        let prefix = #"{"aps":{"alert":""#
        let suffix = #""}}"#
        return ByteBuffer(string: prefix + String(repeating: "x", count: size - prefix.count - suffix.count) + suffix)
    }

    @Test(arguments: cases.indices)
    func rejectsWithTheExactReason(_ index: Int) {
        let (name, notification, code) = Self.cases[index]
        #expect(throws: APNsValidationError.self, "\(name)") { try notification.validate() }
        do {
            try notification.validate()
        } catch {
            #expect(error.code == code, "\(name): \(error)")
        }
    }

    @Test func acceptsGoodNotifications() throws {
        try Self.make().validate()
        try Self.make(token: String(repeating: "AB", count: 100)).validate()  // 200 hex, upper case
        try Self.make(token: String(repeating: "ab", count: 40)).validate()  // 80-byte token
        try Self.make(pushType: .background, payload: ByteBuffer(string: #"{"aps":{"content-available":1},"x":2}"#)).validate()
        try Self.make(topic: "com.example.app.voip", pushType: .voip, payload: Self.padded(5120)).validate()
        try Self.make(payload: Self.padded(4096)).validate()
        try Self.make(collapseID: String(repeating: "c", count: 64)).validate()
        try Self.make(topic: "com.example.app.push-type.liveactivity", pushType: .liveactivity,
                      payload: ByteBuffer(string: #"{"aps":{"event":"update","timestamp":1732000000,"content-state":{}}}"#)).validate()
        try Self.make(priority: 1, expiration: 0).validate()
        try Self.make(payload: ByteBuffer(string: #" { "aps" : { "alert" : { "title" : "a\"b\u00e9", "loc-args" : [1, -2.5e3, true, false, null] }, "badge" : 0 }, "custom" : { "k" : [ ] } } "#)).validate()
        try Self.make(pushType: .background, payload: ByteBuffer(string: #"{"x":{"aps":1},"aps":{"content-available":1}}"#)).validate()
        #expect(Self.make(pushType: .background).effectivePriority == 5)
        #expect(Self.make().effectivePriority == 10)
    }

    @Test func apnsIDIsStableAcrossCopies() {
        let notification = Self.make()
        let copy = notification
        #expect(copy.apnsID == notification.apnsID)
        #expect(Self.make().apnsID != notification.apnsID)
    }
}

@Suite("Reasons and classification", .timeLimit(.minutes(3)))
struct ClassificationTests {
    @Test func everyDocumentedReasonClassifies() {
        for (reason, status) in APNsReason.documented {
            #expect(APNsReason(reason.description) == reason)
            let expected: APNsResultClass = switch (status, reason) {
            case (410, _): .unregistered
            case (403, .expiredProviderToken): .retryable
            case (403, _): .credentialFault
            case (429, .tooManyProviderTokenUpdates): .credentialFault
            case (429, _), (500, _), (503, _): .retryable
            default: .rejected
            }
            #expect(APNsResultClass(status: status, reason: reason) == expected, "\(status) \(reason)")
        }
        #expect(APNsReason.documented.count == 32)
    }

    @Test func oddAnswersStillClassify() {
        #expect(APNsReason("SomethingNew") == .unknown("SomethingNew"))
        #expect(APNsResultClass(status: 200, reason: nil) == .delivered)
        #expect(APNsResultClass(status: 502, reason: nil) == .retryable)
        #expect(APNsResultClass(status: 418, reason: .unknown("Teapot")) == .rejected)
        #expect(APNsResultClass(status: 403, reason: nil) == .credentialFault)
        #expect(APNsResultClass(status: 429, reason: nil) == .retryable)
    }
}

@Suite("Endpoints", .timeLimit(.minutes(3)))
struct EndpointTests {
    @Test func parses() throws {
        #expect(try APNsEndpoint(parsing: "production") == .production)
        #expect(try APNsEndpoint(parsing: "development") == .development)
        #expect(try APNsEndpoint(parsing: "https://127.0.0.1:2197") == APNsEndpoint(host: "127.0.0.1", port: 2197))
        #expect(try APNsEndpoint(parsing: "https://[::1]:8443/") == APNsEndpoint(host: "::1", port: 8443))
        #expect(try APNsEndpoint(parsing: "https://apns.internal") == APNsEndpoint(host: "apns.internal", port: 443))
        for bad in ["http://x:1", "https://", "https://x:0", "https://x:99999", "https://x:abc", "staging"] {
            #expect(throws: APNsError.self, "\(bad)") { try APNsEndpoint(parsing: bad) }
        }
    }
}
