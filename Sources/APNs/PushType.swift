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
    public func accepts(topic: String) -> Bool {
        if topicSuffix.isEmpty {
            // A bare bundle id: none of the longer suffixes may be on it.
            return !PushType.allCases.contains { !$0.topicSuffix.isEmpty && topic.hasSuffix($0.topicSuffix) }
        }
        return topic.hasSuffix(topicSuffix) && topic.count > topicSuffix.count
    }
}
