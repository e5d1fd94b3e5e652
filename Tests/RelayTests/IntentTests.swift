import Foundation
import NIOCore
@testable import Relay
import Testing

@Suite("Intents and outcomes", .timeLimit(.minutes(3)))
struct IntentTests {
    static let token = String(repeating: "ab", count: 32)
    static let now: Int64 = 1_700_000_000

    static func parse(_ json: String, key: String? = nil) -> Result<Intent, InvalidIntent> {
        do {
            return .success(try Intent.parse(Array(json.utf8), key: key.map { Array($0.utf8) }, now: now, defaultTTL: 86_400))
        } catch {
            return .failure(error)
        }
    }

    static func reason(_ json: String) -> String? {
        if case .failure(let invalid) = parse(json) { return invalid.reason }
        return nil
    }

    /// A parsed intent keeps the notification it checked, marked so (an APNs client does not
    /// check it again); a copy whose field changes has its own fields and an unchecked
    /// notification built from them, and the original is as it was.
    @Test func aParsedIntentsNotificationIsCheckedOnceAndACopyChangesAlone() throws {
        let parsed = try Self.parse(#"{"id":"a","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{"alert":"hi"}}}"#).get()
        #expect(parsed.notification.isValidated)
        var changed = parsed
        changed.payload = ByteBuffer(string: #"{"aps":{"alert":"changed"}}"#)
        changed.topic = "com.y"
        #expect(!changed.notification.isValidated)
        #expect(changed.notification.payload == ByteBuffer(string: #"{"aps":{"alert":"changed"}}"#))
        #expect(changed.notification.topic == "com.y")
        #expect(parsed.notification.isValidated)
        #expect(parsed.payload == ByteBuffer(string: #"{"aps":{"alert":"hi"}}"#))
        #expect(parsed.notification.topic == "com.x")
    }

    @Test func defaultsApply() throws {
        let intent = try Self.parse(#"{"id":"a","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{"alert":"hi"}}}"#).get()
        #expect(intent.pushType == .alert)
        #expect(intent.priority == 10)
        #expect(intent.environment == .production)
        #expect(intent.expiration == Self.now + 86_400)
        let background = try Self.parse(#"{"id":"b","token":"\#(Self.token)","topic":"com.x","push_type":"background","payload":{"aps":{"content-available":1}}}"#).get()
        #expect(background.priority == 5)
        let nowOrNever = try Self.parse(#"{"id":"c","token":"\#(Self.token)","topic":"com.x","expiration":0,"environment":"development","payload":{"aps":{}}}"#).get()
        #expect(nowOrNever.expiration == 0)
        #expect(nowOrNever.environment == .development)
    }

    /// A re-drive's mark (`redrive`, written by `apns-relay redrive`): an object, kept through a
    /// mailbox (the intent's encoding) and, as a re-drive adds it last, over an earlier one.
    @Test func aRedriveMarkIsReadKeptAndChecked() throws {
        let base = #"{"id":"r","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{}}"#
        let marked = try Self.parse(base + #","redrive":{"lane":"old","offset":1},"redrive":{"lane":"apns.intents","offset":7}}"#).get()
        #expect(marked.redrive.map { String(decoding: $0, as: UTF8.self) } == #"{"lane":"apns.intents","offset":7}"#)
        let again = try Intent.parse(marked.encoded, key: nil, now: Self.now, defaultTTL: 86_400)
        #expect(again.redrive == marked.redrive)
        #expect(Self.reason(base + #","redrive":"x"}"#) == "BadRedrive")
        #expect(Self.reason(base + #","redrive":{"pad":"\#(String(repeating: "x", count: 600))"}}"#) == "BadRedrive")
        // What a re-drive produces reads back with the mark last and the expiration pinned.
        let produced = Redrive.marked(Array((base + "}").utf8), lane: "apns.intents", partition: 2, offset: 9, at: 5, expiration: Self.now + 60)
        let parsed = try Intent.parse(produced, key: nil, now: Self.now + 1000, defaultTTL: 86_400)
        #expect(parsed.expiration == Self.now + 60)
        #expect(parsed.redrive.map { String(decoding: $0, as: UTF8.self) } == #"{"lane":"apns.intents","partition":2,"offset":9,"at":5}"#)
    }

    /// The dedupe record keeps APNs' answer; records written before it (the status alone)
    /// still read.
    @Test func answerRecordsReadBackAsWritten() {
        let full = AnswerRecord(status: "rejected", httpStatus: 400, apnsID: "6B0C-1", reason: "BadDeviceToken")
        #expect(full.encoded == "2 rejected 400 - 6B0C-1 BadDeviceToken")
        #expect(AnswerRecord(full.encoded) == full)
        let gone = AnswerRecord(status: "unregistered", httpStatus: 410, unregisteredAt: 1_432_819_882_000, apnsID: "A", reason: "Unregistered")
        #expect(AnswerRecord(gone.encoded) == gone)
        let delivered = AnswerRecord(status: "delivered", httpStatus: 200, apnsID: "B")
        #expect(AnswerRecord(delivered.encoded) == delivered)
        #expect(AnswerRecord("delivered") == AnswerRecord(status: "delivered"))
        #expect(AnswerRecord("2 rejected 400 - - a reason with spaces")?.reason == "a reason with spaces")
        // A field that would split the line is not kept.
        #expect(AnswerRecord(status: "rejected", httpStatus: 400, apnsID: "a b").encoded == "2 rejected 400 - - -")
        for garbage in ["", "3 x y z w v", "2 - 1 2 3 4", "2 rejected", "a b"] {
            #expect(AnswerRecord(garbage) == nil, "\(garbage)")
        }
    }

    /// Review item 19: a topic is a bundle id, so no topic can run into the next part of a Redis
    /// key (a ":" made "a:b" + id "c" and "a" + id "b:c" one dedupe record; a topic ending in
    /// ":applied" was another topic's badge record), and a token has one spelling.
    @Test func redisKeyPartsCannotRunIntoEachOther() throws {
        for topic in ["com.x:applied", "com.x:y", "com.x y", "com.é", "com/x", "com.x{1}", "*"] {
            #expect(Self.reason(#"{"id":"a","token":"\#(Self.token)","topic":"\#(topic)","payload":{"aps":{}}}"#) == "BadTopic", "\(topic)")
        }
        for topic in ["com.example.app", "com.Example.my-app_2", "io.x9.A-b"] {
            #expect(Self.reason(#"{"id":"a","token":"\#(Self.token)","topic":"\#(topic)","payload":{"aps":{}}}"#) == nil, "\(topic)")
        }
        let upper = try Self.parse(#"{"id":"a","token":"\#(Self.token.uppercased())","topic":"com.x","payload":{"aps":{}}}"#).get()
        #expect(upper.token == Self.token)
        #expect(RedisKeys.standard.seen(token: upper.token, topic: upper.topic, id: upper.id)
            == RedisKeys.standard.seen(token: Self.token, topic: "com.x", id: "a"))
    }

    /// Invalid UTF-8 anywhere in an intent's strings (payload keys and values, topic, id) makes
    /// it `invalid`, naming the byte; well-formed characters of every length pass.
    @Test func invalidUTF8AnywhereIsRefusedWithItsOffset() throws {
        func bytes(_ before: String, _ bad: [UInt8], _ after: String) -> (message: [UInt8], offset: Int) {
            (Array(before.utf8) + bad + Array(after.utf8), before.utf8.count)
        }
        let token = Self.token
        let cases: [(String, [UInt8], String)] = [
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":"hi "#, [0xC0, 0xAF], #""}}}"#),  // overlong
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":"#, [], ""),  // placeholder, replaced below
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{},"k"#, [0xED, 0xA0, 0x80], #"":1}}"#),  // surrogate in a key
            (#"{"id":"a","token":"\#(token)","topic":"com."#, [0xF4, 0x90, 0x80, 0x80], #"","payload":{"aps":{}}}"#),  // past U+10FFFF in the topic
            (#"{"id":""#, [0xE2, 0x82], #"","token":"\#(token)","topic":"com.x","payload":{"aps":{}}}"#),  // truncated in the id
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":""#, [0x80], #""}}}"#),  // lone continuation
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":""#, [0xFF], #""}}}"#),
        ].filter { !$0.1.isEmpty }
        for (before, bad, after) in cases {
            let (message, offset) = bytes(before, bad, after)
            do {
                _ = try Intent.parse(message, key: nil, now: Self.now, defaultTTL: 86_400)
                Issue.record("accepted \(bad)")
            } catch {
                #expect(error.reason == "InvalidUTF8", "\(bad): \(error)")
                #expect(error.message.contains("at byte \(offset)"), "\(bad): \(error.message)")
            }
        }
        let fine = #"{"id":"é€😀","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":"é € 😀 \u00e9"},"ключ":"値"}}"#
        let intent = try Intent.parse(Array(fine.utf8), key: nil, now: Self.now, defaultTTL: 86_400)
        #expect(intent.id == "é€😀")
    }

    /// A number no double can hold (`1e999` is infinite as a double) makes the intent `invalid`,
    /// in the payload (such a payload is not JSON to Foundation, nor likely to APNs) or in the
    /// intent itself, naming the byte; numbers at the edges of the range pass.
    @Test func aNumberOutOfDoubleRangeIsRefusedWithItsOffset() throws {
        let token = Self.token
        let cases: [(String, String)] = [
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{},"k":["#, #"5e3903,"x"]}}"#),
            (#"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{"alert":"x"},"n":"#, #"-1E309}}"#),
            (#"{"id":"a","token":"\#(token)","topic":"com.x","expiration":"#, #"1e999,"payload":{"aps":{}}}"#),
        ]
        for (before, after) in cases {
            let message = Array((before + after).utf8)
            do {
                _ = try Intent.parse(message, key: nil, now: Self.now, defaultTTL: 86_400)
                Issue.record("accepted \(before + after)")
            } catch {
                #expect(error.message.contains("out of range"), "\(error)")
                #expect(error.message.contains("at byte \(before.utf8.count)"), "\(error.message)")
            }
        }
        let edges = #"{"id":"a","token":"\#(token)","topic":"com.x","payload":{"aps":{},"k":[1.7976931348623157e308,-1e308,5e-324,1e-999]}}"#
        _ = try Intent.parse(Array(edges.utf8), key: nil, now: Self.now, defaultTTL: 86_400)
    }

    @Test func apnsIDIsStablePerIntentID() throws {
        let first = try Self.parse(#"{"id":"same","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{}}}"#).get()
        let second = try Self.parse(#"{"id":"same","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{"alert":"x"}}}"#).get()
        let other = try Self.parse(#"{"id":"other","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{}}}"#).get()
        #expect(first.notification.apnsID == second.notification.apnsID)
        #expect(first.notification.apnsID != other.notification.apnsID)
    }

    @Test func everyKindOfBadMessageIsNamed() {
        let t = Self.token
        let cases: [(String, String)] = [
            ("not json", "NotJSON"),
            ("[1,2]", "NotJSON"),
            (#"{"token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#, "MissingField"),
            (#"{"id":7,"token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#, "MissingField"),
            (#"{"id":"","token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#, "BadId"),
            (#"{"id":"\#(String(repeating: "i", count: 129))","token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#, "BadId"),
            (#"{"id":"a","topic":"com.x","payload":{"aps":{}}}"#, "MissingField"),
            (#"{"id":"a","token":"\#(t)","payload":{"aps":{}}}"#, "MissingField"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x"}"#, "MissingField"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x app","payload":{"aps":{}}}"#, "BadTopic"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x\n","payload":{"aps":{}}}"#, "BadTopic"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","payload":"hi"}"#, "BadPayload"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","payload":{"x":1}}"#, "BadPayload"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","push_type":"fax","payload":{"aps":{}}}"#, "InvalidPushType"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","priority":"high","payload":{"aps":{}}}"#, "BadPriority"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","priority":true,"payload":{"aps":{}}}"#, "BadPriority"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","priority":7,"payload":{"aps":{}}}"#, "BadPriority"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","environment":"staging","payload":{"aps":{}}}"#, "BadEnvironment"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","expiration":-1,"payload":{"aps":{}}}"#, "BadExpirationDate"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","expiration":1.5,"payload":{"aps":{}}}"#, "BadExpirationDate"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","expiration":253402300800,"payload":{"aps":{}}}"#, "BadExpirationDate"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","token_registered_at":-1,"payload":{"aps":{}}}"#, "BadTokenRegisteredAt"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","token_registered_at":"yesterday","payload":{"aps":{}}}"#, "BadTokenRegisteredAt"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","token_registered_at":253402300800000,"payload":{"aps":{}}}"#, "BadTokenRegisteredAt"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","collapse_id":5,"payload":{"aps":{}}}"#, "BadCollapseId"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","collapse_id":"\#(String(repeating: "c", count: 65))","payload":{"aps":{}}}"#, "BadCollapseId"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","collapse_id":"a\r\nb","payload":{"aps":{}}}"#, "BadCollapseId"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","collapse_id":"a\u0000b","payload":{"aps":{}}}"#, "BadCollapseId"),
            (#"{"id":"a","token":"zz","topic":"com.x","payload":{"aps":{}}}"#, "BadDeviceToken"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","push_type":"voip","payload":{"aps":{}}}"#, "BadTopic"),
            (#"{"id":"a","token":"\#(t)","topic":"com.x","payload":{"aps":{"alert":"\#(String(repeating: "x", count: 4100))"}}}"#, "PayloadTooLarge"),
            ("{" + String(repeating: " ", count: 17_000) + "}", "MessageTooLarge"),
        ]
        for (json, expected) in cases {
            #expect(Self.reason(json) == expected, "\(json.prefix(80))")
        }
    }

    @Test func invalidMessagesKeepWhatCanBeKnown() {
        guard case .failure(let invalid) = Self.parse(#"{"id":"keep-me","token":"zz","topic":"com.x","payload":{"aps":{}}}"#, key: "kk") else {
            Issue.record("accepted")
            return
        }
        #expect(invalid.id == "keep-me")
        #expect(invalid.token == "zz")
        #expect(invalid.topic == "com.x")
        guard case .failure(let garbage) = Self.parse("nope", key: "the-key") else { return }
        #expect(garbage.id == nil)
        #expect(garbage.token == "the-key")
    }

    /// How a parked intent is kept: written back as an intent that parses to the same one.
    @Test func anEncodedIntentParsesBackToTheSameIntent() throws {
        let t = String(repeating: "ab", count: 32)
        let original = try Self.parse(#"{"id":"e\"1","token":"\#(t)","topic":"com.x","push_type":"alert","priority":5,"expiration":1900000000,"collapse_id":"c","environment":"development","badge":{"increment":-2},"payload":{"aps":{"alert":"hi \u00e9"},"k":[1,2]}}"#).get()
        let again = try Intent.parse(original.encoded, key: nil, now: 0, defaultTTL: 5)
        #expect(again.id == original.id && again.token == t && again.topic == "com.x")
        #expect(again.pushType == original.pushType && again.priority == 5 && again.expiration == 1_900_000_000)
        #expect(again.collapseID == "c" && again.environment == .development && again.badge == .increment(-2))
        #expect(again.payload == original.payload)
        // No expiration given: the one resolved when it was consumed is kept.
        let defaulted = try Self.parse(#"{"id":"d","token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#).get()
        #expect(try Intent.parse(defaulted.encoded, key: nil, now: 99, defaultTTL: 1).expiration == defaulted.expiration)
    }

    @Test func outcomeJSONHasEveryFieldInOrder() throws {
        let outcome = Outcome(id: "a\"b", token: nil, topic: "com.x", status: .unregistered, httpStatus: 410,
                              reason: "Unregistered", apnsID: "id", unregisteredAt: 5, attempts: 2,
                              latencyMilliseconds: 7, lane: "apns.intents", partition: 3, offset: 42, worker: "w", at: 9)
        #expect(outcome.json == #"{"v":1,"id":"a\"b","token":null,"channel_id":null,"topic":"com.x","status":"unregistered","original_status":null,"http_status":410,"reason":"Unregistered","apns_id":"id","apns_unique_id":null,"unregistered_at":5,"badge":null,"superseded_by":null,"policy_decision":null,"priority_downgraded":null,"attempts":2,"latency_ms":7,"lane":"apns.intents","partition":3,"offset":42,"worker":"w","at":9,"metadata":null,"collapse_id":null,"redrive":null}"#)
        #expect(try JSONSerialization.jsonObject(with: Data(outcome.json.utf8)) is [String: Any])
    }
}

extension IntentTests {
    @Test func escapedStringsAreDecodedAndThePayloadIsSentCompact() throws {
        let json = """
            {"id":"caf\\u00e9-1","token":"\(Self.token)","topic":"com.x","ignored":[1,{"x":null}],
             "payload": { "aps" : { "alert" : "hi  there" } , "n" : 1 } }
            """
        let intent = try Self.parse(json).get()
        #expect(intent.id == "café-1")
        #expect(String(buffer: intent.payload) == #"{"aps":{"alert":"hi  there"},"n":1}"#)
    }

    @Test func theLastOfARepeatedFieldCounts() throws {
        let intent = try Self.parse(#"{"id":"a","id":"b","token":"\#(Self.token)","topic":"com.x","payload":{"aps":{}}}"#).get()
        #expect(intent.id == "b")
    }

    @Test func outcomeJSONEscapesControlCharactersAndKeepsUnicode() {
        let outcome = Outcome(id: "tab\there\u{1}é", token: nil, topic: nil, status: .invalid, partition: -1, offset: -7,
                              worker: "w", at: 0)
        #expect(outcome.json.hasPrefix(#"{"v":1,"id":"tab\there\u0001é","token":null"#))
        #expect(outcome.json.contains(#""partition":-1,"offset":-7,"#))
    }
}

extension IntentTests {
    @Test func badgeChangesAreReadOrNamedBad() throws {
        let t = Self.token
        let increment = try Self.parse(#"{"id":"b1","token":"\#(t)","topic":"com.x","badge":{"increment":2},"payload":{"aps":{}}}"#).get()
        #expect(increment.badge == .increment(2))
        let clear = try Self.parse(#"{"id":"b2","token":"\#(t)","topic":"com.x","badge":{"set":0},"payload":{"aps":{}}}"#).get()
        #expect(clear.badge == .set(0))
        #expect(try Self.parse(#"{"id":"b3","token":"\#(t)","topic":"com.x","payload":{"aps":{}}}"#).get().badge == nil)
        for bad in [#"{"set":-1}"#, #"{"set":1000001}"#, #"{"increment":-9223372036854775807}"#, #"{"increment":1,"set":2}"#, #"{"increment":"1"}"#, #"{"add":1}"#, #"{}"#, "3", #""set""#] {
            #expect(Self.reason(#"{"id":"b","token":"\#(t)","topic":"com.x","badge":\#(bad),"payload":{"aps":{}}}"#) == "BadBadge", "\(bad)")
        }
    }
}

@Suite("Relay metrics", .timeLimit(.minutes(3)))
struct RelayMetricsTests {
    /// A set of its own (the relay's is process-wide: relays of other tests fill it too).
    @Test func reasonLabelsStayBoundedWhateverAPNsAnswers() {
        let reasons = RelayMetrics.ReasonLabels(limit: RelayMetrics.maxReasonLabels)
        #expect(reasons.label("RetryDeadline: ServiceUnavailable") == "RetryDeadline")
        #expect(reasons.label(nil) == "none")
        let labels = Set((0..<500).map { reasons.label("ServerInvented\($0): detail") })
        #expect(labels.count == RelayMetrics.maxReasonLabels - 2 + 1)
        #expect(labels.contains("other"))
        #expect(reasons.label("RetryDeadline: Shutdown") == "RetryDeadline")
        #expect(RelayMetrics.reasonLabel("RetryDeadline: Shutdown") == "RetryDeadline")
    }
}
