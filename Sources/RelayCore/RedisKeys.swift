/// Every key the relay keeps in Redis, in one place. All start with `redis.key_prefix`
/// (`apns-relay:` unless set, the prefix written below), so that deployments sharing a Redis or a
/// Redis Cluster keep apart; the scripts take every key from their callers. A device's
/// keys share the hash tag `{<token>}`, so every script touches one hash slot (Redis Cluster);
/// the due index and the provider tokens have hash tags of their own.
///
/// Per device (`<token>`) and app (`<topic>`):
/// - `apns-relay:seen:{<token>}:<topic>:<id>` — string, APNs' answer to the intent
///   (``AnswerRecord``), kept for the topic's dedupe window (``Deduplicator``).
/// - `apns-relay:rate:{<token>}` — string: the token bucket as a GCRA theoretical arrival time
///   (epoch ms): each send moves it one interval (`1000 / refill_per_second` ms, rounded up)
///   on, from now at the earliest; a send is allowed while it lies at most `burst - 1`
///   intervals ahead (the bucket is full when it is not ahead at all) (``DeviceAdmission/Bucket``).
/// - `apns-relay:backoff:{<token>}` — string `<until ms> <level>`: the 429 backoff (its level
///   doubles the wait while 429s repeat).
/// - `apns-relay:mailbox:{<token>}:<topic>` — hash: the parked intent (`pid` id, `p` entry, `pe`
///   expiration, `pd` due ms), the one being sent from it (`cid`, `c`, `ce`, `cu` lease end ms),
///   and the displaced ones whose `coalesced` outcome is not acknowledged yet (`d:<id>` entry,
///   `db:<id>` what displaced it, `dl:<id>` `<until ms> <owner>` its hand-over's lease).
/// - `apns-relay:waiting:{<token>}:<topic>` — string `<length of pid>:<pid><cid>`: the ids the
///   mailbox holds, kept by the scripts next to it (with its TTL) so that an admission reads
///   them with the other strings in one `MGET`.
/// - `apns-relay:shadow-waiting:{<token>}:<topic>` — string, epoch ms: in shadow mode
///   (`policy.mode`), the due time of the intent enforce mode would have parked, so that until
///   then shadow mode decides the device's later intents as enforce mode would (they wait
///   behind it) (``DeviceAdmission/ShadowMailbox``). Enforce mode never reads it.
/// - `apns-relay:last:{<token>}:<topic>` — string, the last notification APNs accepted
///   (``DeviceRecords``).
/// - `apns-relay:unregistered:{<token>}:<topic>` — string, the timestamp (epoch ms) of APNs' last
///   410 for the pair, kept `policy.known_unregistered_ttl_seconds` and deleted by a delivery
///   (only with `policy.skip_known_unregistered`).
/// - `apns-relay:badge:{<token>}:<topic>` — the badge count, and
///   `apns-relay:badge:{<token>}:<topic>:applied` — hash of intent id → the count it produced
///   (``BadgeStore``).
///
/// - `apns-relay:redrive:{<token>}:<topic>:<id>` — string: when `apns-relay redrive` produced the
///   intent again (epoch ms), kept until its expiration, so that a second run does not.
/// - `apns-relay:quarantine:{<token>}:<topic>:<id>` — string: a claimed mailbox entry no relay
///   could read, moved out of the mailbox, kept 30 days for an operator.
/// - `apns-relay:budget:{<token>}:<topic>:<kind>` — sorted set of the intent ids that spent a
///   Live Activity budget (`p10`, `start`), scored by when (epoch ms), over a sliding window
///   (``LiveActivityPacer``).
///
/// Per partition of the intents topic:
/// - `apns-relay:due:{<intents topic>:<partition>}` — sorted set of `<token> <topic> <id>` by the
///   time the mailbox entry may be sent (or its claim's lease ends), so whichever relay owns the
///   partition delivers its devices' mailboxes.
///
/// Per provider key:
/// - `apns-relay:jwt:{<team id>:<key id>}` — hash `jwt`, `iat`: the fleet's provider token
///   (``RedisProviderTokenSource``).
package struct RedisKeys: Sendable, Equatable {
    /// The prefix when `redis.key_prefix` is not set: the keys every earlier release wrote.
    package static let defaultPrefix = "apns-relay:"
    package static let standard = RedisKeys(prefix: defaultPrefix)

    /// Starts every key (``RelayConfiguration/Redis/keyPrefix``, checked by the loader: no
    /// braces, which would move the hash tag, no spaces or control characters).
    package let prefix: String

    package init(prefix: String) {
        self.prefix = prefix
    }

    package func seen(token: String, topic: String, id: String) -> String { string { writeSeen(&$0, token: token, topic: topic, id: id) } }
    package func rate(token: String) -> String { string { writeRate(&$0, token: token) } }
    package func backoff(token: String) -> String { string { writeBackoff(&$0, token: token) } }
    package func mailbox(token: String, topic: String) -> String { string { writeMailbox(&$0, token: token, topic: topic) } }
    package func waiting(token: String, topic: String) -> String { string { writeWaiting(&$0, token: token, topic: topic) } }
    package func shadowWaiting(token: String, topic: String) -> String { string { writeShadowWaiting(&$0, token: token, topic: topic) } }
    package func lastSent(token: String, topic: String) -> String { string { writeLastSent(&$0, token: token, topic: topic) } }
    package func unregistered(token: String, topic: String) -> String { string { writeUnregistered(&$0, token: token, topic: topic) } }
    package func badgeCount(token: String, topic: String) -> String { string { write(&$0, "badge", token: token, topic: topic) } }
    package func badgeApplied(token: String, topic: String) -> String { badgeCount(token: token, topic: topic) + ":applied" }
    /// An intent `apns-relay redrive` produced again (``Redrive``).
    package func redrive(token: String, topic: String, id: String) -> String { string { write(&$0, "redrive", token: token, topic: topic) } + ":" + id }
    /// A mailbox entry no relay could read, moved aside (``DevicePolicy/quarantine(partition:token:topic:id:)``).
    package func quarantine(token: String, topic: String, id: String) -> String { string { write(&$0, "quarantine", token: token, topic: topic) } + ":" + id }
    /// A Live Activity budget of the device (``LiveActivityPacer``): `kind` `p10` or `start`.
    package func budget(token: String, topic: String, kind: String) -> String { string { write(&$0, "budget", token: token, topic: topic) } + ":" + kind }
    package func due(intentsTopic: String, partition: Int32) -> String { "\(prefix)due:{\(intentsTopic):\(partition)}" }
    package func providerToken(teamID: String, keyID: String) -> String { "\(prefix)jwt:{\(teamID):\(keyID)}" }

    /// A due-index member: `<token> <topic> <id>` (the index's key carries the prefix).
    package static func member(token: String, topic: String, id: String) -> String { "\(token) \(topic) \(id)" }

    /// (token, topic, id) of a due-index member.
    package static func parseMember(_ member: String) -> (token: String, topic: String, id: String)? {
        let parts = member.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else { return nil }
        return (String(parts[0]), String(parts[1]), String(parts[2]))
    }

    // The keys written straight into a command's bytes (hot paths: no string per key).

    package func writeSeen(_ bytes: inout [UInt8], token: String, topic: String, id: String) {
        write(&bytes, "seen", token: token, topic: topic)
        bytes.append(UInt8(ascii: ":"))
        bytes.append(contentsOf: id.utf8)
    }

    package func writeRate(_ bytes: inout [UInt8], token: String) { write(&bytes, "rate", token: token) }
    package func writeBackoff(_ bytes: inout [UInt8], token: String) { write(&bytes, "backoff", token: token) }

    package func writeMailbox(_ bytes: inout [UInt8], token: String, topic: String) {
        write(&bytes, "mailbox", token: token, topic: topic)
    }

    package func writeWaiting(_ bytes: inout [UInt8], token: String, topic: String) {
        write(&bytes, "waiting", token: token, topic: topic)
    }

    package func writeShadowWaiting(_ bytes: inout [UInt8], token: String, topic: String) {
        write(&bytes, "shadow-waiting", token: token, topic: topic)
    }

    package func writeUnregistered(_ bytes: inout [UInt8], token: String, topic: String) {
        write(&bytes, "unregistered", token: token, topic: topic)
    }

    package func writeLastSent(_ bytes: inout [UInt8], token: String, topic: String) {
        write(&bytes, "last", token: token, topic: topic)
    }

    /// `<prefix><kind>:{<token>}`
    private func write(_ bytes: inout [UInt8], _ kind: StaticString, token: String) {
        bytes.append(contentsOf: prefix.utf8)
        kind.withUTF8Buffer { bytes.append(contentsOf: $0) }
        bytes.append(contentsOf: ":{".utf8)
        bytes.append(contentsOf: token.utf8)
        bytes.append(UInt8(ascii: "}"))
    }

    /// `<prefix><kind>:{<token>}:<topic>`
    private func write(_ bytes: inout [UInt8], _ kind: StaticString, token: String, topic: String) {
        write(&bytes, kind, token: token)
        bytes.append(UInt8(ascii: ":"))
        bytes.append(contentsOf: topic.utf8)
    }

    /// A key as a string, from the writer the hot paths use.
    private func string(_ write: (inout [UInt8]) -> Void) -> String {
        var bytes: [UInt8] = []
        write(&bytes)
        return String(decoding: bytes, as: UTF8.self)
    }
}
