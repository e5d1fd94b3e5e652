/// `apns-push-type`, with the topic suffix APNs requires for each.
public enum PushType: String, Sendable, CaseIterable, Codable {
    case alert, background, voip, complication, fileprovider, mdm, liveactivity, location, pushtotalk
    case widgets, controls

    /// What `apns-topic` must end with: the bundle id plus this.
    public var topicSuffix: String {
        switch self {
        case .alert, .background, .mdm: ""
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .location: ".location-query"
        case .liveactivity: ".push-type.liveactivity"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        }
    }

    /// Largest payload APNs accepts for this push type, in bytes.
    public var maxPayloadBytes: Int { self == .voip ? 5120 : 4096 }

    /// The priority used when the notification names none.
    public var defaultPriority: Int { self == .background ? 5 : 10 }

    /// Whether `topic` carries the suffix this push type needs (and nothing else's suffix).
    ///
    /// An ASCII topic (every bundle id) is compared byte by byte; another by characters, as a
    /// character may join the suffix's dot to the one before it.
    public func accepts(topic: String) -> Bool {
        guard Self.isASCII(topic) else { return acceptsByCharacters(topic) }
        if topicSuffix.isEmpty {
            // A bare bundle id: none of the longer suffixes may be on it.
            return !Self.suffixes.contains { Self.endsWith(topic, $0) }
        }
        return Self.endsWith(topic, topicSuffix) && topic.utf8.count > topicSuffix.utf8.count
    }

    private func acceptsByCharacters(_ topic: String) -> Bool {
        if topicSuffix.isEmpty {
            return !Self.suffixes.contains { topic.hasSuffix($0) }
        }
        return topic.hasSuffix(topicSuffix) && topic.count > topicSuffix.count
    }

    private static func isASCII(_ topic: String) -> Bool {
        var topic = topic
        return topic.withUTF8 { $0.allSatisfy { $0 < 0x80 } }
    }

    /// Every push type's topic suffix that is not empty (`allCases` would be an array made on
    /// each call).
    private static let suffixes = allCases.map(\.topicSuffix).filter { !$0.isEmpty }

    private static func endsWith(_ topic: String, _ suffix: String) -> Bool {
        topic.utf8.count >= suffix.utf8.count && topic.utf8.suffix(suffix.utf8.count).elementsEqual(suffix.utf8)
    }
}
