import APNs
import APNsSimulator
import NIOCore
import Testing

/// Live Activity, widget and controls payloads as the device takes them (``PushTypePayloads``):
/// refused before sending with the rule named; the simulator, like APNs, answers them 200 and
/// counts what a device would have dropped.
@Suite("Live Activity, widget and controls payloads", .timeLimit(.minutes(3)))
struct PushTypePayloadTests {
    static let liveTopic = "com.example.app.push-type.liveactivity"

    static func live(_ aps: String) -> APNsNotification {
        APNsNotification(deviceToken: sampleToken, topic: liveTopic, pushType: .liveactivity, priority: 10,
                         payload: ByteBuffer(string: #"{"aps":{\#(aps)}}"#))
    }

    static func reload(_ pushType: PushType, _ aps: String) -> APNsNotification {
        APNsNotification(deviceToken: sampleToken, topic: "com.example.app" + pushType.topicSuffix, pushType: pushType,
                         payload: ByteBuffer(string: #"{"aps":{\#(aps)}}"#))
    }

    static let start = #""event":"start","timestamp":1732000000,"attributes-type":"Delivery","attributes":{"order":"31"},"content-state":{"eta":25},"alert":{"title":"On its way"}"#

    static let valid: [(String, APNsNotification)] = [
        ("update", live(#""event":"update","timestamp":1732000000,"content-state":{"eta":12},"stale-date":1732003600,"relevance-score":0.5"#)),
        ("end without content-state", live(#""event":"end","timestamp":1732000000,"dismissal-date":1732003600"#)),
        ("end with the final content-state", live(#""event":"end","timestamp":1732000000,"content-state":{"eta":0}"#)),
        ("push-to-start", live(start)),
        ("push-to-start asking for the update token", live(start + #","input-push-token":1"#)),
        ("push-to-start subscribing to a channel", live(start + #","input-push-channel":"dHN0LTEyMzQ1Njc4OTAxMjM0NTY=""#)),
        ("widgets", reload(.widgets, #""content-changed":true"#)),
        ("controls", reload(.controls, #""content-changed":true"#)),
    ]

    static let refused: [(String, APNsNotification, String)] = [
        ("no event", live(#""timestamp":1732000000,"content-state":{}"#), "aps.event"),
        ("unknown event", live(#""event":"pause","timestamp":1732000000,"content-state":{}"#), "aps.event"),
        ("no timestamp", live(#""event":"update","content-state":{}"#), "aps.timestamp"),
        ("timestamp as text", live(#""event":"update","timestamp":"1732000000","content-state":{}"#), "aps.timestamp"),
        ("update without content-state", live(#""event":"update","timestamp":1732000000"#), "content-state"),
        ("content-state not an object", live(#""event":"update","timestamp":1732000000,"content-state":[1]"#), "content-state"),
        ("start without attributes-type", live(#""event":"start","timestamp":1732000000,"attributes":{},"content-state":{},"alert":"x""#), "attributes-type"),
        ("start without attributes", live(#""event":"start","timestamp":1732000000,"attributes-type":"A","content-state":{},"alert":"x""#), "aps.attributes"),
        ("start without an alert", live(#""event":"start","timestamp":1732000000,"attributes-type":"A","attributes":{},"content-state":{}"#), "aps.alert"),
        ("input-push-token 2", live(start + #","input-push-token":2"#), "input-push-token"),
        ("both input keys", live(start + #","input-push-token":1,"input-push-channel":"abc=""#), "exclude each other"),
        ("update with attributes", live(#""event":"update","timestamp":1732000000,"content-state":{},"attributes":{}"#), "start only"),
        ("end asking for a token", live(#""event":"end","timestamp":1732000000,"input-push-token":1"#), "start only"),
        ("dismissal-date on an update", live(#""event":"update","timestamp":1732000000,"content-state":{},"dismissal-date":1"#), "dismissal-date"),
        ("stale-date on an end", live(#""event":"end","timestamp":1732000000,"stale-date":1"#), "stale-date"),
        ("relevance-score as text", live(#""event":"update","timestamp":1732000000,"content-state":{},"relevance-score":"high""#), "relevance-score"),
        ("widgets without content-changed", reload(.widgets, ""), "content-changed"),
        ("widgets with content-changed 1", reload(.widgets, #""content-changed":1"#), "content-changed"),
        ("widgets with an alert", reload(.widgets, #""content-changed":true,"alert":"x""#), "aps.alert"),
        ("controls with a sound", reload(.controls, #""content-changed":true,"sound":"default""#), "aps.sound"),
    ]

    @Test func theRulesAcceptWhatTheDeviceTakes() throws {
        for (name, notification) in Self.valid {
            do {
                try notification.validate()
            } catch {
                Issue.record("\(name): \(error)")
            }
        }
    }

    @Test func theRulesRefuseWhatTheDeviceDropsNamingTheRule() {
        for (name, notification, rule) in Self.refused {
            do {
                try notification.validate()
                Issue.record("\(name) was accepted")
            } catch {
                #expect(error.code == .badPayload && error.message.contains(rule), "\(name): \(error)")
            }
        }
    }

    /// The 4 KB of `content-state` and `attributes` are counted as the system re-encodes them:
    /// `1e9` (3 bytes) becomes `1000000000` (10), so 2 KB as written is over 4 KB.
    @Test func theContentCapCountsTheReEncodedSize() throws {
        let numbers = Array(repeating: "1e9", count: 500).joined(separator: ",")
        let grown = Self.live(#""event":"update","timestamp":1732000000,"content-state":{"v":[\#(numbers)]}"#)
        #expect(grown.payload.readableBytes < 4096)
        #expect(throws: APNsValidationError.self) { try grown.validate() }
        let small = Self.live(#""event":"update","timestamp":1732000000,"content-state":{"v":[\#(Array(repeating: "1", count: 500).joined(separator: ","))]}"#)
        try small.validate()
    }

    /// The simulator answers such a push 200, as APNs does, and counts it as a device would
    /// drop it (sent here without the client's validation, as another sender might).
    @Test func theSimulatorCountsWhatADeviceWouldDrop() async throws {
        let harness = try await Harness.start()
        func post(_ pushType: PushType, _ topic: String, _ aps: String) async throws -> Int {
            try await harness.client.request(method: "POST", path: "/3/device/\(sampleToken)",
                                             headers: [("apns-push-type", pushType.rawValue), ("apns-topic", topic)],
                                             body: Array(#"{"aps":{\#(aps)}}"#.utf8)).status
        }
        #expect(try await post(.liveactivity, Self.liveTopic, #""event":"update","timestamp":1732000000"#) == 200)
        #expect(try await post(.liveactivity, Self.liveTopic, #""event":"update","timestamp":1732000000,"content-state":{}"#) == 200)
        #expect(try await post(.widgets, "com.example.app.push-type.widgets", #""alert":"x""#) == 200)
        #expect(harness.simulator.droppedOnDevice.values.reduce(0, +) == 2, "\(harness.simulator.droppedOnDevice)")
        #expect(harness.simulator.droppedOnDevice.keys.contains { $0.contains("content-state") })
        await harness.stop()
    }
}
