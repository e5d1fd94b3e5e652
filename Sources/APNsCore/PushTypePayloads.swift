import Foundation

/// What Live Activity, widget and controls payloads must hold for the device to act on them
/// (protocol doc, "Live Activities, push-to-start and widgets"). APNs answers 200 to a payload
/// that breaks these rules and the device drops it, so the relay refuses it at intake, with the
/// rule named (``APNsNotification/validate()``), and the simulator counts what a device would
/// have dropped.
///
/// Live Activity (`liveactivity`, to an activity token or, for `start`, a push-to-start token):
/// - `aps.event` is `start`, `update` or `end`, and `aps.timestamp` an integer (epoch seconds);
/// - `start` and `update` carry `aps.content-state` (an object; `end` may carry the final one);
/// - `start` carries `attributes-type` (a non-empty string), `attributes` (an object) and an
///   `alert`; `input-push-token` (`1`: the started activity reports its update token) or
///   `input-push-channel` (a channel id it subscribes to) only with `start`, and not both;
/// - `update` and `end` carry neither `attributes-type` nor `attributes`;
/// - `dismissal-date` (an integer) only with `end`; `stale-date` (an integer) not with `end`;
///   `relevance-score` a number;
/// - `content-state` and `attributes` together at most ``maxLiveActivityContentBytes`` once
///   re-encoded as compact JSON (the system measures them after re-encoding: `1.50` becomes
///   `1.5`, `1e3` becomes `1000`).
///
/// Widgets (`widgets`) and controls (`controls`): `aps.content-changed` is `true`, and the push
/// carries no `alert`, `sound` or `badge` (the system reloads the app's widgets or controls; it
/// shows nothing). Controls pushes follow the widgets' shape: the protocol doc gives no other.
public enum PushTypePayloads {
    /// `content-state` and `attributes` together, in bytes of compact JSON.
    public static let maxLiveActivityContentBytes = 4_096

    /// What is wrong with `bytes` (a JSON object already checked well formed) for `pushType`,
    /// or nil; nil for push types without such rules.
    public static func problem(_ pushType: PushType, _ bytes: UnsafeRawBufferPointer) -> String? {
        switch pushType {
        case .liveactivity: liveActivityProblem(bytes)
        case .widgets, .controls: contentChangedProblem(bytes, pushType)
        default: nil
        }
    }

    /// `aps.event` of a Live Activity payload, if it has one.
    public static func liveActivityEvent(_ bytes: UnsafeRawBufferPointer) -> String? {
        guard case .string(let event)? = apsMembers(bytes)?["event"] else { return nil }
        return event
    }

    /// The members of `aps`, as values (objects and arrays as ranges of `bytes`); nil when the
    /// payload has no `aps` object or does not read.
    private static func apsMembers(_ bytes: UnsafeRawBufferPointer) -> [String: JSONReader.Value]? {
        var aps: JSONReader.Value?
        var members: [String: JSONReader.Value] = [:]
        do {
            var reader = JSONReader(bytes)
            guard reader.nextIs(UInt8(ascii: "{")) else { return nil }
            try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                if key == "aps" { aps = try reader.readValue(depth: 1) } else { try reader.skipValue(depth: 1) }
            }
            guard case .object(let range)? = aps else { return nil }
            var inner = JSONReader(UnsafeRawBufferPointer(rebasing: bytes[range]))
            try inner.forEachMember { reader, key throws(JSONReader.Failure) in
                // Ranges of nested values are relative to `aps`' own bytes: shift them.
                switch try reader.readValue(depth: 2) {
                case .object(let nested): members[key] = .object(nested.lowerBound + range.lowerBound..<nested.upperBound + range.lowerBound)
                case .array(let nested): members[key] = .array(nested.lowerBound + range.lowerBound..<nested.upperBound + range.lowerBound)
                case let value: members[key] = value
                }
            }
        } catch {
            return nil
        }
        return members
    }

    private static func liveActivityProblem(_ bytes: UnsafeRawBufferPointer) -> String? {
        guard let aps = apsMembers(bytes) else { return #"a Live Activity payload needs an "aps" dictionary"# }
        guard case .string(let event)? = aps["event"], ["start", "update", "end"].contains(event) else {
            return #"aps.event must be "start", "update" or "end""#
        }
        guard aps["timestamp"]?.exactInteger != nil else { return "aps.timestamp must be an integer (epoch seconds)" }
        let contentState = aps["content-state"]
        if let contentState {
            guard case .object = contentState else { return "aps.content-state must be an object" }
        } else if event != "end" {
            return "a Live Activity \(event) needs aps.content-state"
        }
        if event == "start" {
            guard case .string(let type)? = aps["attributes-type"], !type.isEmpty else {
                return "a Live Activity start needs aps.attributes-type (the attributes' Swift type name)"
            }
            guard case .object? = aps["attributes"] else { return "a Live Activity start needs aps.attributes (an object)" }
            guard aps["alert"] != nil else { return "a Live Activity start needs aps.alert" }
            if let token = aps["input-push-token"], token.exactInteger != 1 { return "aps.input-push-token must be 1" }
            if let channel = aps["input-push-channel"] {
                guard case .string(let id) = channel, !id.isEmpty else { return "aps.input-push-channel must be a channel id (a string)" }
                if aps["input-push-token"] != nil { return "aps.input-push-token and aps.input-push-channel exclude each other" }
            }
        } else {
            for key in ["attributes-type", "attributes", "input-push-token", "input-push-channel"] where aps[key] != nil {
                return "aps.\(key) belongs to a start only, not to an \(event)"
            }
        }
        if let dismissal = aps["dismissal-date"] {
            guard event == "end" else { return "aps.dismissal-date belongs to an end only" }
            guard dismissal.exactInteger != nil else { return "aps.dismissal-date must be an integer (epoch seconds)" }
        }
        if let stale = aps["stale-date"] {
            guard event != "end" else { return "aps.stale-date does not belong to an end" }
            guard stale.exactInteger != nil else { return "aps.stale-date must be an integer (epoch seconds)" }
        }
        if let score = aps["relevance-score"] {
            switch score {
            case .integer, .number: break
            default: return "aps.relevance-score must be a number"
            }
        }
        let size = [contentState, aps["attributes"]].reduce(0) { total, value in
            guard case .object(let range)? = value else { return total }
            return total + canonicalSize(UnsafeRawBufferPointer(rebasing: bytes[range]))
        }
        if size > maxLiveActivityContentBytes {
            return "aps.content-state and aps.attributes take \(size) bytes re-encoded, at most \(maxLiveActivityContentBytes) allowed"
        }
        return nil
    }

    /// The size of a JSON value re-encoded compactly (numbers as the system writes them, and `/`
    /// as `\/`, as Foundation's encoders write it by default: where the device's encoding is not
    /// known, the count errs on the large side).
    static func canonicalSize(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard let object = try? JSONSerialization.jsonObject(with: Data(bytes), options: [.fragmentsAllowed]),
              let encoded = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .fragmentsAllowed]) else {
            return bytes.count
        }
        return encoded.count
    }

    private static func contentChangedProblem(_ bytes: UnsafeRawBufferPointer, _ pushType: PushType) -> String? {
        guard let aps = apsMembers(bytes) else { return "a \(pushType.rawValue) payload needs an \"aps\" dictionary" }
        guard case .bool(true)? = aps["content-changed"] else { return "a \(pushType.rawValue) push needs aps.content-changed: true" }
        for key in ["alert", "sound", "badge"] where aps[key] != nil {
            return "a \(pushType.rawValue) push shows nothing: aps.\(key) is not allowed"
        }
        return nil
    }
}
