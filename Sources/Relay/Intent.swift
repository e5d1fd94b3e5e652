public import APNs
public import Foundation
public import NIOCore

/// A notification intent: one Kafka message on the intents topic (UTF-8 JSON, key = device
/// token). docs/intents.md describes it; docs/intent.schema.json is its JSON Schema.
public struct Intent: Sendable {
    public var id: String
    public var token: String
    public var topic: String
    public var pushType: PushType
    public var priority: Int
    /// Epoch seconds; 0 means now or never.
    public var expiration: Int64
    public var collapseID: String?
    public var environment: APNsEnvironment
    /// The payload as it will be sent.
    public var payload: ByteBuffer

    /// The notification for APNs; its apns-id is derived from the intent id so that every
    /// attempt, in any process, carries the same one.
    public var notification: APNsNotification {
        APNsNotification(deviceToken: token, topic: topic, pushType: pushType, priority: priority,
                         expiration: expiration, collapseID: collapseID, apnsID: Intent.apnsID(for: id),
                         payload: payload)
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
    /// The device token, when the message had one (else the Kafka key, if any).
    public var token: String?
    public var topic: String?
}

extension Intent {
    /// Largest intent message accepted (the payload limit plus room for the envelope).
    public static let maxMessageBytes = 16 * 1024

    /// Parses and validates one message value. `now` is epoch seconds; `defaultTTL` applies when
    /// the intent names no expiration.
    public static func parse(_ value: [UInt8], key: [UInt8]?, now: Int64, defaultTTL: Int64) throws(InvalidIntent) -> Intent {
        let keyToken = key.map { String(decoding: $0, as: UTF8.self) }
        func invalid(_ reason: String, _ message: String, id: String? = nil, token: String? = nil, topic: String? = nil) -> InvalidIntent {
            InvalidIntent(reason: reason, message: message, id: id, token: token ?? keyToken, topic: topic)
        }
        guard value.count <= maxMessageBytes else {
            throw invalid("MessageTooLarge", "intent is \(value.count) bytes, at most \(maxMessageBytes) allowed")
        }
        guard let object = (try? JSONSerialization.jsonObject(with: Data(value), options: [])) as? [String: Any] else {
            throw invalid("NotJSON", "intent is not a JSON object")
        }
        let rawID = object["id"]
        let id = rawID as? String
        let token = object["token"] as? String
        let topic = object["topic"] as? String
        func fail(_ reason: String, _ message: String) -> InvalidIntent {
            invalid(reason, message, id: id.flatMap { (1...128).contains($0.count) ? $0 : nil }, token: token, topic: topic)
        }
        guard let id else {
            throw fail("MissingField", rawID == nil ? "\"id\" is missing" : "\"id\" must be a string")
        }
        guard (1...128).contains(id.count) else {
            throw fail("BadId", "\"id\" must be 1 to 128 characters, got \(id.count)")
        }
        guard let token else {
            throw fail("MissingField", object["token"] == nil ? "\"token\" is missing" : "\"token\" must be a string")
        }
        guard let topic, !topic.isEmpty else {
            throw fail("MissingField", object["topic"] == nil ? "\"topic\" is missing" : "\"topic\" must be a non-empty string")
        }
        guard let payloadObject = object["payload"] else { throw fail("MissingField", "\"payload\" is missing") }
        guard payloadObject is [String: Any] else { throw fail("BadPayload", "\"payload\" must be a JSON object") }

        var pushType = PushType.alert
        if let text = object["push_type"] {
            guard let text = text as? String, let parsed = PushType(rawValue: text) else {
                throw fail("InvalidPushType", "\"push_type\" must be one of \(PushType.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            pushType = parsed
        }
        var priority = pushType.defaultPriority
        if let value = object["priority"] {
            guard let number = value as? NSNumber, !isBool(number), let parsed = Int(exactly: number.doubleValue) else {
                throw fail("BadPriority", "\"priority\" must be an integer (10, 5 or 1)")
            }
            priority = parsed
        }
        var environment = APNsEnvironment.production
        if let value = object["environment"] {
            guard let text = value as? String, let parsed = APNsEnvironment(rawValue: text) else {
                throw fail("BadEnvironment", "\"environment\" must be production or development")
            }
            environment = parsed
        }
        var expiration = now + defaultTTL
        if let value = object["expiration"] {
            guard let number = value as? NSNumber, !isBool(number), let parsed = Int64(exactly: number.doubleValue), parsed >= 0 else {
                throw fail("BadExpirationDate", "\"expiration\" must be epoch seconds (an integer, 0 for now-or-never)")
            }
            expiration = parsed
        }
        var collapseID: String?
        if let value = object["collapse_id"] {
            guard let text = value as? String else { throw fail("BadCollapseId", "\"collapse_id\" must be a string") }
            collapseID = text
        }
        guard let payloadData = try? JSONSerialization.data(withJSONObject: payloadObject, options: [.withoutEscapingSlashes]) else {
            throw fail("BadPayload", "\"payload\" cannot be serialised")
        }
        let intent = Intent(id: id, token: token, topic: topic, pushType: pushType, priority: priority,
                            expiration: expiration, collapseID: collapseID, environment: environment,
                            payload: ByteBuffer(bytes: payloadData))
        do {
            try intent.notification.validate()
        } catch {
            throw fail(error.code.rawValue, error.message)
        }
        return intent
    }

    private static func isBool(_ number: NSNumber) -> Bool {
        String(cString: number.objCType) == "c" || type(of: number) == type(of: NSNumber(value: true))
    }
}
