import APNs
import Common
import NIOCore
import Redis

/// Badge counts per (device token, topic), kept in Redis.
///
/// Keys (one device's keys share the hash tag `{token}`, so the script touches one slot):
/// `<prefix>badge:{<token>}:<topic>` holds the count (kept 30 days after its last change);
/// `<prefix>badge:{<token>}:<topic>:applied` maps intent ids to the count they produced
/// (kept for the dedupe window), so an intent retried or redelivered changes the count once.
struct BadgeStore: Sendable {
    static let countTTL = 30 * 86_400

    /// KEYS: count, applied. ARGV: intent id, "set" or "increment", n, applied TTL, count TTL,
    /// largest count. A count key holding something else than a number counts as 0.
    static let script = RedisScript(RedisScripts.source(PackageResources.badge_lua))

    let client: RedisClient
    let keys: RedisKeys
    let appliedTTL: Int64

    /// Applies the intent's change once and returns the resulting count.
    func apply(_ change: BadgeChange, intentID: String, token: String, topic: String) async throws(RedisError) -> Int64 {
        let (mode, amount): (String, Int64) = switch change {
        case .increment(let n): ("increment", n)
        case .set(let n): ("set", n)
        }
        let reply = try await client.evaluate(Self.script, keys: [keys.badgeCount(token: token, topic: topic), keys.badgeApplied(token: token, topic: topic)],
                                              arguments: [intentID, mode, amount, appliedTTL, Self.countTTL, BadgeChange.limit])
        guard let count = reply.integer else { throw .protocolError("badge script answered \(reply)") }
        return count
    }

    /// The payload with `aps.badge` set to `count` (added when absent, replaced when present).
    /// The payload is compact JSON whose `aps` is an object (intents are validated first).
    static func payload(_ payload: ByteBuffer, badge count: Int64) -> ByteBuffer {
        var bytes = Array(payload.readableBytesView)
        var apsOpen: Int?
        var badgeRange: Range<Int>?
        var apsEmpty = true
        bytes.withUnsafeBytes { raw in
            var reader = JSONReader(raw)
            try? reader.forEachMember { reader, key throws(JSONReader.Failure) in
                guard key == "aps", reader.nextIs(UInt8(ascii: "{")) else {
                    try reader.skipValue(depth: 1)
                    return
                }
                apsOpen = reader.index
                try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                    apsEmpty = false
                    let start = reader.index
                    try reader.skipValue(depth: 2)
                    if key == "badge" { badgeRange = start..<reader.index }
                }
            }
        }
        var number: [UInt8] = []
        DecimalDigits.append(Int64(count), to: &number)
        if let badgeRange {
            bytes.replaceSubrange(badgeRange, with: number)
        } else if let apsOpen {
            bytes.insert(contentsOf: Array(#""badge":"#.utf8) + number + (apsEmpty ? [] : [UInt8(ascii: ",")]), at: apsOpen + 1)
        }
        return ByteBuffer(bytes: bytes)
    }
}
