@testable import Relay
import Testing

@Suite("Redis key schema", .timeLimit(.minutes(3)))
struct RedisKeysTests {
    @Test func everyKeyOfADeviceSharesItsHashTag() {
        let token = "ab12", topic = "com.x"
        let keys = [RedisKeys.standard.seen(token: token, topic: topic, id: "i"), RedisKeys.standard.rate(token: token),
                    RedisKeys.standard.backoff(token: token), RedisKeys.standard.mailbox(token: token, topic: topic),
                    RedisKeys.standard.waiting(token: token, topic: topic), RedisKeys.standard.lastSent(token: token, topic: topic),
                    RedisKeys.standard.badgeCount(token: token, topic: topic), RedisKeys.standard.badgeApplied(token: token, topic: topic)]
        #expect(keys == ["apns-relay:seen:{ab12}:com.x:i", "apns-relay:rate:{ab12}", "apns-relay:backoff:{ab12}",
                         "apns-relay:mailbox:{ab12}:com.x", "apns-relay:waiting:{ab12}:com.x", "apns-relay:last:{ab12}:com.x",
                         "apns-relay:badge:{ab12}:com.x", "apns-relay:badge:{ab12}:com.x:applied"])
        #expect(RedisKeys.standard.due(intentsTopic: "apns.intents", partition: 3) == "apns-relay:due:{apns.intents:3}")
        #expect(RedisKeys.standard.providerToken(teamID: "T", keyID: "K") == "apns-relay:jwt:{T:K}")
    }

    /// `redis.key_prefix` starts every key and leaves the hash tags as they are.
    @Test func aPrefixStartsEveryKey() {
        let keys = RedisKeys(prefix: "staging:")
        #expect(keys.mailbox(token: "ab12", topic: "com.x") == "staging:mailbox:{ab12}:com.x")
        #expect(keys.seen(token: "ab12", topic: "com.x", id: "i") == "staging:seen:{ab12}:com.x:i")
        #expect(keys.badgeApplied(token: "ab12", topic: "com.x") == "staging:badge:{ab12}:com.x:applied")
        #expect(keys.due(intentsTopic: "apns.intents", partition: 3) == "staging:due:{apns.intents:3}")
        #expect(keys.providerToken(teamID: "T", keyID: "K") == "staging:jwt:{T:K}")
    }

    @Test func dueIndexMembersReadBack() throws {
        let member = RedisKeys.member(token: "ab", topic: "com.x", id: "an id with spaces")
        let parts = try #require(RedisKeys.parseMember(member))
        #expect(parts.token == "ab" && parts.topic == "com.x" && parts.id == "an id with spaces")
        for unreadable in ["", "ab", "ab com.x", "ab  id", " com.x id", "ab com.x "] {
            #expect(RedisKeys.parseMember(unreadable) == nil, "\(unreadable)")
        }
    }

    /// The `waiting` value (`<length of pid>:<pid><cid>`) read as what the mailbox holds for an
    /// intent being admitted; an unreadable value holds nothing.
    @Test func aWaitingValueSaysWhatTheMailboxHoldsForAnIntent() {
        func holds(_ value: String?, _ id: String) -> DeviceAdmission.MailboxHolds {
            DeviceAdmission.mailbox(value.map { Array($0.utf8) }, holdsFor: id)
        }
        #expect(holds(nil, "a") == .nothing)
        #expect(holds("0:", "a") == .nothing)
        #expect(holds("1:a", "a") == .thisIntent)  // parked
        #expect(holds("0:a", "a") == .thisIntent)  // being sent
        #expect(holds("1:ab", "b") == .thisIntent)
        #expect(holds("1:ab", "c") == .anotherIntent)
        #expect(holds("0:b", "a") == .anotherIntent)
        #expect(holds("2:ab", "a") == .anotherIntent)  // "ab" parked, not "a"
        #expect(holds("9:a", "a") == .nothing)
        #expect(holds("x", "a") == .nothing)
        #expect(holds("-1:a", "a") == .nothing)
    }
}
