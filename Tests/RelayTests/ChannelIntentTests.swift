import APNs
import Foundation
import NIOCore
import Relay
import Testing

/// Intents on broadcast channels (`channel_id` instead of `token`): what is read, what is
/// refused (with APNs' reason names), and the request that goes out.
@Suite("Channel intents", .timeLimit(.minutes(1)))
struct ChannelIntentTests {
    static let channel = "dHN0LTEyMzQ1Njc4OTAxMjM0NTY="
    static let update = #"{"aps":{"event":"update","timestamp":1732000000,"content-state":{"score":"2-1"}}}"#

    static func json(_ extra: String = "", channel: String = #""\#(channel)""#, topic: String = "com.example.live",
                     payload: String = update) -> String {
        #"{"id":"c-1","channel_id":\#(channel),"topic":"\#(topic)"\#(extra),"payload":\#(payload)}"#
    }

    @Test func aChannelIntentIsALiveActivityBroadcast() throws {
        let intent = try IntentTests.parse(Self.json(), key: Self.channel).get()
        #expect(intent.channelID == Self.channel && intent.token.isEmpty && intent.recipient == "channel:\(Self.channel)")
        #expect(intent.pushType == .liveactivity && intent.priority == 10 && intent.messageStoragePolicy == nil)
        #expect(intent.expiration == IntentTests.now + 86_400)
        let notification = intent.notification
        #expect(notification.channelID == Self.channel && notification.topic == "com.example.live" && notification.expiration == intent.expiration)
        #expect(notification.apnsID == Intent.apnsID(for: "c-1"))

        // A No-Message-Stored channel: expiration 0 unless told (and only 0).
        let unstored = try IntentTests.parse(Self.json(#","message_storage_policy":0,"priority":5"#)).get()
        #expect(unstored.expiration == 0 && unstored.priority == 5 && unstored.messageStoragePolicy == 0)
        #expect(try IntentTests.parse(Self.json(#","message_storage_policy":0,"expiration":0"#)).get().expiration == 0)
        let stored = try IntentTests.parse(Self.json(#","message_storage_policy":1,"expiration":1800000000"#)).get()
        #expect(stored.expiration == 1_800_000_000)

        // Kept as it came (a mailbox never holds one, but the encoding is the intent's).
        let again = try Intent.parse(stored.encoded, key: nil, now: 0, defaultTTL: 1)
        #expect(again.channelID == Self.channel && again.token.isEmpty && again.messageStoragePolicy == 1 && again.expiration == 1_800_000_000)
        #expect(again.payload == stored.payload)
    }

    /// Every refusal, named as APNs names it where APNs has a name.
    @Test func everyBadChannelIntentIsNamed() {
        let t = IntentTests.token
        let big = #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":"\#(String(repeating: "x", count: 5_100))"}}}"#
        let cases: [(String, String)] = [
            (Self.json(#","token":"\#(t)""#), "TokenAndChannelId"),
            (Self.json(channel: "7"), "BadChannelId"),
            (Self.json(channel: "null"), "BadChannelId"),
            (Self.json(channel: #""""#), "MissingChannelId"),
            (Self.json(channel: #""not base64!""#), "BadChannelId"),
            (Self.json(topic: "com.example.live.push-type.liveactivity"), "TopicDisallowed"),
            (Self.json(#","push_type":"alert""#), "InvalidPushType"),
            (Self.json(#","priority":7"#), "BadPriority"),
            (Self.json(#","message_storage_policy":0,"expiration":1800000000"#), "BadExpirationDate"),
            (Self.json(#","message_storage_policy":2"#), "BadMessageStoragePolicy"),
            (Self.json(#","message_storage_policy":"none""#), "BadMessageStoragePolicy"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","message_storage_policy":1,"payload":{"aps":{}}}"#, "BadMessageStoragePolicy"),
            (Self.json(#","collapse_id":"c""#), "BadCollapseId"),
            (Self.json(#","badge":{"set":1}"#), "BadBadge"),
            (Self.json(#","token_registered_at":5"#), "BadTokenRegisteredAt"),
            (Self.json(payload: big), "PayloadTooLarge"),
            (Self.json(payload: "{}"), "BadRequestPayload"),
            (Self.json(payload: #"{"aps":{"event":"start","timestamp":1,"content-state":{}}}"#), "BadRequestPayload"),
            (Self.json(payload: #"{"aps":{"event":"update","timestamp":"now","content-state":{}}}"#), "BadRequestPayload"),
            (Self.json(payload: #"{"aps":{"event":"end","timestamp":1.5,"content-state":{}}}"#), "BadRequestPayload"),
            (Self.json(payload: #"{"aps":{"event":"update","timestamp":1}}"#), "BadRequestPayload"),
            (Self.json(payload: #"{"aps":{"event":"update","timestamp":1,"content-state":[1]}}"#), "BadRequestPayload"),
        ]
        for (json, expected) in cases {
            #expect(IntentTests.reason(json) == expected, "\(json.prefix(120))")
        }
        // What an end looks like is fine.
        #expect(IntentTests.reason(Self.json(payload: #"{"aps":{"event":"end","timestamp":1,"content-state":{},"dismissal-date":2}}"#)) == nil)
        // A payload of 5,120 bytes is the limit, not over it (device liveactivity pushes stay at 4,096).
        let filler = 5_120 - #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":""}}}"#.utf8.count
        let largest = #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":"\#(String(repeating: "x", count: filler))"}}}"#
        #expect(IntentTests.reason(Self.json(payload: largest)) == nil)
    }

    /// A refused channel intent's outcome names its channel, never the Kafka key as a token.
    @Test func aRefusedChannelIntentKeepsItsChannel() {
        guard case .failure(let invalid) = IntentTests.parse(Self.json(#","priority":7"#), key: Self.channel) else {
            Issue.record("accepted")
            return
        }
        #expect(invalid.channelID == Self.channel && invalid.token == nil && invalid.id == "c-1")
        guard case .failure(let both) = IntentTests.parse(Self.json(#","token":"zz""#), key: "zz") else { return }
        #expect(both.channelID == Self.channel && both.token == "zz")
    }

    @Test func anOutcomeOfAChannelIntentCarriesItsChannelAndUniqueID() {
        var outcome = Outcome(id: "c-1", token: nil, topic: "com.example.live", status: .delivered, httpStatus: 200,
                              apnsID: "id", partition: 0, offset: 1, worker: "w", at: 9)
        outcome.channelID = Self.channel
        outcome.apnsUniqueID = "u-1"
        #expect(outcome.json.contains(#""token":null,"channel_id":"\#(Self.channel)","topic":"com.example.live""#))
        #expect(outcome.json.contains(#""apns_id":"id","apns_unique_id":"u-1""#))
    }
}
