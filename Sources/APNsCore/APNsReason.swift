/// The `reason` APNs gives with an error status, parsed; anything new lands in `unknown`.
public enum APNsReason: Sendable, Hashable, CustomStringConvertible {
    // 400
    case badCollapseId, badDeviceToken, badExpirationDate, badMessageId, badPriority, badTopic
    case deviceTokenNotForTopic, duplicateHeaders, idleTimeout, invalidPushType, missingDeviceToken
    case missingTopic, payloadEmpty, topicDisallowed
    // 403
    case badCertificate, badCertificateEnvironment, expiredProviderToken, forbidden
    case invalidProviderToken, missingProviderToken, unrelatedKeyIdInToken, badEnvironmentKeyIdInToken
    // 404, 405, 410, 413
    case badPath, methodNotAllowed, unregistered, expiredToken, payloadTooLarge
    // 429, 500, 503
    case tooManyProviderTokenUpdates, tooManyRequests, internalServerError, serviceUnavailable, shutdown
    case unknown(String)

    /// Every reason the protocol documents, with its HTTP status.
    public static let documented: [(reason: APNsReason, status: Int)] = [
        (.badCollapseId, 400), (.badDeviceToken, 400), (.badExpirationDate, 400), (.badMessageId, 400),
        (.badPriority, 400), (.badTopic, 400), (.deviceTokenNotForTopic, 400), (.duplicateHeaders, 400),
        (.idleTimeout, 400), (.invalidPushType, 400), (.missingDeviceToken, 400), (.missingTopic, 400),
        (.payloadEmpty, 400), (.topicDisallowed, 400),
        (.badCertificate, 403), (.badCertificateEnvironment, 403), (.expiredProviderToken, 403),
        (.forbidden, 403), (.invalidProviderToken, 403), (.missingProviderToken, 403),
        (.unrelatedKeyIdInToken, 403), (.badEnvironmentKeyIdInToken, 403),
        (.badPath, 404), (.methodNotAllowed, 405), (.unregistered, 410), (.expiredToken, 410),
        (.payloadTooLarge, 413), (.tooManyProviderTokenUpdates, 429), (.tooManyRequests, 429),
        (.internalServerError, 500), (.serviceUnavailable, 503), (.shutdown, 503),
    ]

    private static let byName: [String: APNsReason] = Dictionary(
        uniqueKeysWithValues: documented.map { ($0.reason.description, $0.reason) })

    public init(_ text: String) {
        self = APNsReason.byName[text] ?? .unknown(text)
    }

    /// The wire spelling.
    public var description: String {
        switch self {
        case .badCollapseId: "BadCollapseId"
        case .badDeviceToken: "BadDeviceToken"
        case .badExpirationDate: "BadExpirationDate"
        case .badMessageId: "BadMessageId"
        case .badPriority: "BadPriority"
        case .badTopic: "BadTopic"
        case .deviceTokenNotForTopic: "DeviceTokenNotForTopic"
        case .duplicateHeaders: "DuplicateHeaders"
        case .idleTimeout: "IdleTimeout"
        case .invalidPushType: "InvalidPushType"
        case .missingDeviceToken: "MissingDeviceToken"
        case .missingTopic: "MissingTopic"
        case .payloadEmpty: "PayloadEmpty"
        case .topicDisallowed: "TopicDisallowed"
        case .badCertificate: "BadCertificate"
        case .badCertificateEnvironment: "BadCertificateEnvironment"
        case .expiredProviderToken: "ExpiredProviderToken"
        case .forbidden: "Forbidden"
        case .invalidProviderToken: "InvalidProviderToken"
        case .missingProviderToken: "MissingProviderToken"
        case .unrelatedKeyIdInToken: "UnrelatedKeyIdInToken"
        case .badEnvironmentKeyIdInToken: "BadEnvironmentKeyIdInToken"
        case .badPath: "BadPath"
        case .methodNotAllowed: "MethodNotAllowed"
        case .unregistered: "Unregistered"
        case .expiredToken: "ExpiredToken"
        case .payloadTooLarge: "PayloadTooLarge"
        case .tooManyProviderTokenUpdates: "TooManyProviderTokenUpdates"
        case .tooManyRequests: "TooManyRequests"
        case .internalServerError: "InternalServerError"
        case .serviceUnavailable: "ServiceUnavailable"
        case .shutdown: "Shutdown"
        case .unknown(let text): text
        }
    }
}
