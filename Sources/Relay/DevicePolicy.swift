import Foundation
import Redis

/// Per-device rules kept in Redis: dedupe, the token bucket, 429 backoff and the mailbox
/// (store-and-forward of the newest intent that could not go out yet).
///
/// Keys (a device's keys share the hash tag `{<token>}`, so every script touches one slot;
/// the due index is a key of its own, written by plain commands):
/// - `apns-relay:seen:{<token>}:<topic>:<id>` — string, the status APNs' answer gave the intent,
///   kept for the topic's dedupe window.
/// - `apns-relay:device:{<token>}` — hash: `t` tokens left and `at` when counted (ms), `bu`
///   backoff until (ms), `bl` backoff level (doubles while 429s repeat).
/// - `apns-relay:mailbox:{<token>}:<topic>` — hash: the parked intent (`pid` id, `p` entry, `pe`
///   expiration, `pd` due ms) and the one being sent from it (`cid`, `c`, `ce`, `cu` lease end ms).
/// - `apns-relay:due:{<intents topic>:<partition>}` — sorted set of `<token> <topic> <id>` by the
///   time the mailbox entry may be sent (or its claim's lease ends). Per partition of the
///   intents topic, so whichever relay owns the partition delivers its devices' mailboxes.
struct DevicePolicy: Sendable {
    let client: RedisClient
    /// The intents topic (names the due indexes).
    let intentsTopic: String
    /// 429 backoff: the first wait, doubling while 429s repeat, up to the maximum.
    let backoffBaseMilliseconds: Int64
    let backoffMaximumMilliseconds: Int64
    /// How long a mailbox entry being sent stays claimed before another attempt may take it.
    static let claimLeaseMilliseconds: Int64 = 120_000

    static func seenKey(token: String, topic: String, id: String) -> String { key { writeSeenKey(&$0, token: token, topic: topic, id: id) } }
    static func deviceKey(token: String) -> String { key { writeDeviceKey(&$0, token: token) } }
    static func mailboxKey(token: String, topic: String) -> String { key { writeMailboxKey(&$0, token: token, topic: topic) } }

    // The keys written straight into a command's bytes (hot paths: no string per key).
    static func writeSeenKey(_ bytes: inout [UInt8], token: String, topic: String, id: String) {
        bytes.append(contentsOf: "apns-relay:seen:{".utf8)
        bytes.append(contentsOf: token.utf8)
        bytes.append(contentsOf: "}:".utf8)
        bytes.append(contentsOf: topic.utf8)
        bytes.append(UInt8(ascii: ":"))
        bytes.append(contentsOf: id.utf8)
    }

    static func writeDeviceKey(_ bytes: inout [UInt8], token: String) {
        bytes.append(contentsOf: "apns-relay:device:{".utf8)
        bytes.append(contentsOf: token.utf8)
        bytes.append(UInt8(ascii: "}"))
    }

    static func writeMailboxKey(_ bytes: inout [UInt8], token: String, topic: String) {
        bytes.append(contentsOf: "apns-relay:mailbox:{".utf8)
        bytes.append(contentsOf: token.utf8)
        bytes.append(contentsOf: "}:".utf8)
        bytes.append(contentsOf: topic.utf8)
    }

    private static func key(_ write: (inout [UInt8]) -> Void) -> String {
        var bytes: [UInt8] = []
        write(&bytes)
        return String(decoding: bytes, as: UTF8.self)
    }
    func dueKey(partition: Int32) -> String { "apns-relay:due:{\(intentsTopic):\(partition)}" }
    static func member(token: String, topic: String, id: String) -> String { "\(token) \(topic) \(id)" }

    /// (token, topic, id) of a due-index member.
    static func parseMember(_ member: String) -> (token: String, topic: String, id: String)? {
        let parts = member.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else { return nil }
        return (String(parts[0]), String(parts[1]), String(parts[2]))
    }

    // MARK: Scripts

    /// The token bucket, shared by the admit and take scripts: `bucket` reads and refills it,
    /// `spend` writes it back (keeping the key at least until it is full again, and never
    /// shortening the life the park script gave a device in 429 backoff, so that the backoff's
    /// level is remembered), `due` says when the device may be sent to next.
    private static let bucket = """
        local function bucket(key, now, burst, rate)
            local d = redis.call('HMGET', key, 't', 'at', 'bu')
            local tokens, at = tonumber(d[1]), tonumber(d[2])
            if tokens == nil or at == nil then tokens = burst; at = now end
            if burst > 0 then tokens = math.min(burst, tokens + math.max(0, now - at) * rate) end
            return tokens, tonumber(d[3]) or 0
        end
        local function spend(key, now, burst, rate, tokens, bu)
            redis.call('HSET', key, 't', tokens, 'at', now)
            local keep = math.ceil(burst / rate) + 60000
            if bu == 0 or redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
        end
        local function due(now, burst, rate, tokens, bu)
            local at = now
            if bu > now then at = bu end
            if burst > 0 and tokens < 1 then at = math.max(at, now + math.ceil((1 - tokens) / rate)) end
            return at
        end

        """

    /// The decisions for one device and topic's intents of a consumed batch, in order.
    /// KEYS: device, mailbox, then one seen key per intent. ARGV: now ms, burst, refill per ms,
    /// then the intents' ids. Answers one code per intent (``Admission``), then the due time.
    static let admitScript = RedisScript(bucket + """
        local now, burst, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
        local tokens, bu = bucket(KEYS[1], now, burst, rate)
        local m = redis.call('HMGET', KEYS[2], 'pid', 'cid')
        local out, took = {}, false
        for i = 4, #ARGV do
            local id = ARGV[i]
            if redis.call('EXISTS', KEYS[i - 1]) == 1 then out[#out + 1] = 1
            elseif id == m[1] or id == m[2] then out[#out + 1] = 2
            elseif now < bu then out[#out + 1] = 3
            elseif burst <= 0 then out[#out + 1] = 0
            elseif tokens >= 1 then tokens = tokens - 1; took = true; out[#out + 1] = 0
            else out[#out + 1] = 3 end
        end
        if took then spend(KEYS[1], now, burst, rate, tokens, bu) end
        out[#out + 1] = due(now, burst, rate, tokens, bu)
        return out
        """)

    /// Parks an intent in its mailbox, displacing the one parked there (whose entry it returns).
    /// With a 429, starts or lengthens the device's backoff first.
    /// KEYS: mailbox, device. ARGV: id, entry, expiration (s), due ms, now ms, "1" for a 429,
    /// backoff base ms, backoff maximum ms. Answers {due ms, displaced entry or nil}.
    static let parkScript = RedisScript("""
        local now, due = tonumber(ARGV[5]), tonumber(ARGV[4])
        if ARGV[6] == '1' then
            local b = redis.call('HMGET', KEYS[2], 'bu', 'bl')
            local bu, bl = tonumber(b[1]) or 0, tonumber(b[2]) or 0
            local base, top = tonumber(ARGV[7]), tonumber(ARGV[8])
            if bu == 0 or now > bu + top then bl = 0 else bl = bl + 1 end
            local length = math.min(top, base * (2 ^ math.min(bl, 30)))
            bu = now + length
            redis.call('HSET', KEYS[2], 'bu', bu, 'bl', bl)
            if redis.call('PTTL', KEYS[2]) < length + top then redis.call('PEXPIRE', KEYS[2], length + top) end
            due = math.max(due, bu)
        end
        local m = redis.call('HMGET', KEYS[1], 'pid', 'p', 'cid')
        local displaced = false
        if m[1] and m[1] ~= ARGV[1] then displaced = m[2] end
        local expiration = tonumber(ARGV[3])
        due = math.min(due, expiration * 1000 + 1000)
        redis.call('HSET', KEYS[1], 'pid', ARGV[1], 'p', ARGV[2], 'pe', ARGV[3], 'pd', due)
        if m[3] == ARGV[1] then redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
        local keep = math.max(0, expiration * 1000 - now) + 86400000
        if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
        return {due, displaced}
        """)

    /// Takes a due mailbox entry for sending, if the device may be sent to now.
    /// KEYS: mailbox, device, the entry's seen key. ARGV: id, now ms, burst, refill per ms,
    /// lease ms. Answers ``Take``'s codes: {0} stale, {1, entry} answered before, {2, due} not
    /// yet, {3, entry} claimed, {4, entry} expired (removed).
    static let takeScript = RedisScript(bucket + """
        local id, now, burst, rate = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
        local m = redis.call('HMGET', KEYS[1], 'pid', 'p', 'pe', 'cid', 'c', 'ce', 'cu')
        local entry, expiration, parked
        if m[1] == id then entry, expiration, parked = m[2], tonumber(m[3]) or 0, true
        elseif m[4] == id and (tonumber(m[7]) or 0) <= now then entry, expiration, parked = m[5], tonumber(m[6]) or 0, false
        else return {0} end
        local function clear()
            if parked then redis.call('HDEL', KEYS[1], 'pid', 'p', 'pe', 'pd')
            else redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
        end
        if redis.call('EXISTS', KEYS[3]) == 1 then clear(); return {1, entry} end
        if expiration * 1000 < now then clear(); return {4, entry} end
        local tokens, bu = bucket(KEYS[2], now, burst, rate)
        if now < bu or (burst > 0 and tokens < 1) then
            local at = math.min(due(now, burst, rate, tokens, bu), expiration * 1000 + 1000)
            if parked then redis.call('HSET', KEYS[1], 'pd', at) end
            return {2, at}
        end
        if burst > 0 then spend(KEYS[2], now, burst, rate, tokens - 1, bu) end
        clear()
        redis.call('HSET', KEYS[1], 'cid', id, 'c', entry, 'ce', expiration, 'cu', now + tonumber(ARGV[5]))
        return {3, entry}
        """)

    /// Ends a claim once the claimed intent's outcome is published. KEYS: mailbox. ARGV: id.
    static let releaseScript = RedisScript("""
        if redis.call('HGET', KEYS[1], 'cid') == ARGV[1] then redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu') end
        return 0
        """)

    // MARK: Calls

    enum Admission: Int {
        case send = 0
        /// APNs answered it before: outcome `duplicate`.
        case duplicate = 1
        /// It is in its mailbox already (a redelivery): the mailbox will answer it.
        case inMailbox = 2
        /// The device may not be sent to now: park it (or, with expiration 0, give up).
        case wait = 3
    }

    /// One device and topic's intents of a batch.
    struct Group {
        var token: String
        var topic: String
        var ids: [String]
        var rules: RelayConfiguration.Policy.Rules
    }

    /// Asks for the decisions for every group: one round trip for the batch, written now.
    /// Admissions submitted one after another run in Redis in that order (so a device's tokens
    /// go to its intents in offset order even with several batches under way); a script cache
    /// Redis lost (restart) costs the refused calls a second round trip, which can run after a
    /// later batch's.
    func submitAdmission(_ groups: [Group], now: Int64) -> PendingAdmission {
        var buffer = RedisCommandBuffer(reservingBytes: 256 * groups.count)
        Self.encodeAdmission(groups, indices: groups.indices, now: now, into: &buffer)
        return PendingAdmission(policy: self, groups: groups, now: now, replies: groups.isEmpty ? nil : client.submit(buffer))
    }

    /// `EVALSHA admit` for each group at these positions.
    private static func encodeAdmission(_ groups: [Group], indices: some Sequence<Int>, now: Int64, into buffer: inout RedisCommandBuffer) {
        var refill = (rate: -1.0, text: "")
        for index in indices {
            let group = groups[index]
            let limit = group.rules.rateLimit
            let rate = limit.refillPerSecond / 1000
            if rate != refill.rate { refill = (rate, String(rate)) }
            let token = group.token, topic = group.topic, ids = group.ids, refillText = refill.text
            buffer.append("EVALSHA") { command in
                command.append(admitScript.sha1)
                command.append(2 + ids.count)
                command.appendArgument { Self.writeDeviceKey(&$0, token: token) }
                command.appendArgument { Self.writeMailboxKey(&$0, token: token, topic: topic) }
                for id in ids { command.appendArgument { Self.writeSeenKey(&$0, token: token, topic: topic, id: id) } }
                command.append(now)
                command.append(limit.isEnabled ? limit.burst : 0)
                command.append(refillText)
                for id in ids { command.append(id) }
            }
        }
    }

    /// A batch's admission under way.
    struct PendingAdmission: Sendable {
        let policy: DevicePolicy
        let groups: [Group]
        let now: Int64
        let replies: RedisPendingReplies?

        /// The decisions for every group, and for each the time the device may be sent to next.
        func get() async throws(RedisError) -> [(decisions: [Admission], due: Int64)] {
            guard let replies else { return [] }
            let answers = try await policy.client.reloadingRefused([DevicePolicy.admitScript], replies: try await replies.get()) { refused, buffer in
                DevicePolicy.encodeAdmission(groups, indices: refused, now: now, into: &buffer)
            }
            return try zip(groups.map(\.ids.count), answers).map { count, reply throws(RedisError) in
                guard case .array(let values) = reply, values.count == count + 1,
                      let due = values.last?.integer else { throw .protocolError("admit script answered \(reply)") }
                let decisions = try values.dropLast().map { value throws(RedisError) in
                    guard let code = value.integer, let decision = Admission(rawValue: Int(code)) else {
                        throw .protocolError("admit script answered \(reply)")
                    }
                    return decision
                }
                return (decisions, due)
            }
        }

        /// The same question asked again at `now` (after Redis failed it).
        func again(now: Int64) -> PendingAdmission {
            policy.submitAdmission(groups, now: now)
        }
    }

    /// An intent parked in a mailbox, as stored: where it came from, when it was consumed,
    /// its expiration (resolved when it was consumed) and the message itself.
    struct Entry: Sendable {
        var partition: Int32
        var offset: Int64
        var consumedAt: Int64
        var expiration: Int64
        var message: [UInt8]

        var encoded: [UInt8] { Array("\(partition) \(offset) \(consumedAt) \(expiration)\n".utf8) + message }

        init(partition: Int32, offset: Int64, consumedAt: Int64, expiration: Int64, message: [UInt8]) {
            self.partition = partition
            self.offset = offset
            self.consumedAt = consumedAt
            self.expiration = expiration
            self.message = message
        }

        init?(_ bytes: [UInt8]) {
            guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")) else { return nil }
            let header = String(decoding: bytes[..<newline], as: UTF8.self).split(separator: " ")
            guard header.count == 4, let partition = Int32(header[0]), let offset = Int64(header[1]),
                  let consumedAt = Int64(header[2]), let expiration = Int64(header[3]) else { return nil }
            self.init(partition: partition, offset: offset, consumedAt: consumedAt, expiration: expiration,
                      message: Array(bytes[(newline + 1)...]))
        }
    }

    /// Parks an intent (see ``parkScript``) and indexes it; answers the entry it displaced.
    func park(token: String, topic: String, id: String, entry: Entry, due: Int64, now: Int64,
              tooManyRequests: Bool) async throws(RedisError) -> (due: Int64, displaced: Entry?) {
        let call = RedisCommand.evalsha(Self.parkScript, keys: [Self.mailboxKey(token: token, topic: topic), Self.deviceKey(token: token)],
                                        arguments: [id, entry.encoded, entry.expiration, due, now, tooManyRequests ? "1" : "0",
                                                    backoffBaseMilliseconds, backoffMaximumMilliseconds])
        let reply = try await client.pipelineLoading([Self.parkScript], [call])[0]
        guard case .array(let values) = reply, values.count == 2, let parkedDue = values[0].integer else {
            throw .protocolError("park script answered \(reply)")
        }
        // Indexed after the mailbox write: a crash between the two leaves the intent's offset
        // uncommitted, and its redelivery parks and indexes it again.
        let member = Self.member(token: token, topic: topic, id: id)
        let indexed = try await client.pipeline([RedisCommand("ZADD", [dueKey(partition: entry.partition), parkedDue, member])])
        if case .error(let message) = indexed[0] { throw .server(message) }
        let displaced = values[1].bytes.flatMap(Entry.init)
        return (parkedDue, displaced)
    }

    /// Mailbox members of these partitions due by `now`, at most `limit` per partition.
    func due(partitions: [Int32], now: Int64, limit: Int) async throws(RedisError) -> [(partition: Int32, member: String)] {
        guard !partitions.isEmpty else { return [] }
        let replies = try await client.pipeline(partitions.map {
            RedisCommand("ZRANGEBYSCORE", [dueKey(partition: $0), "-inf", now, "LIMIT", 0, limit])
        })
        var due: [(Int32, String)] = []
        for (partition, reply) in zip(partitions, replies) {
            if case .error(let message) = reply { throw .server(message) }
            guard case .array(let members) = reply else { continue }
            for member in members { if let text = member.string { due.append((partition, text)) } }
        }
        return due
    }

    enum Take {
        case stale
        case answered(Entry)
        case notYet(due: Int64)
        case claimed(Entry)
        case expired(Entry)
    }

    /// Tries to take a due entry for sending; its index member first moves to the end of the
    /// claim's lease, so that if this relay dies with the entry claimed, the partition's next
    /// owner takes it again then.
    func take(partition: Int32, token: String, topic: String, id: String, rules: RelayConfiguration.Policy.Rules,
              now: Int64) async throws(RedisError) -> Take {
        let member = Self.member(token: token, topic: topic, id: id)
        let limit = rules.rateLimit
        let replies = try await client.pipelineLoading([Self.takeScript], [
            RedisCommand("ZADD", [dueKey(partition: partition), now + Self.claimLeaseMilliseconds, member]),
            RedisCommand.evalsha(Self.takeScript,
                                 keys: [Self.mailboxKey(token: token, topic: topic), Self.deviceKey(token: token),
                                        Self.seenKey(token: token, topic: topic, id: id)],
                                 arguments: [id, now, limit.isEnabled ? limit.burst : 0, limit.refillPerSecond / 1000,
                                             Self.claimLeaseMilliseconds]),
        ])
        if case .error(let message) = replies[0] { throw .server(message) }
        guard case .array(let values) = replies[1], let code = values.first?.integer else {
            throw .protocolError("take script answered \(replies[1])")
        }
        func entry() throws(RedisError) -> Entry {
            guard values.count == 2, let bytes = values[1].bytes, let entry = Entry(bytes) else {
                throw .protocolError("take script answered an unreadable entry")
            }
            return entry
        }
        switch code {
        case 0: return .stale
        case 1: return .answered(try entry())
        case 2:
            guard values.count == 2, let due = values[1].integer else { throw .protocolError("take script answered \(replies[1])") }
            return .notYet(due: due)
        case 3: return .claimed(try entry())
        case 4: return .expired(try entry())
        default: throw .protocolError("take script answered \(replies[1])")
        }
    }

    /// Moves a member to a new due time, or removes it (nil).
    func reindex(partition: Int32, member: String, due: Int64?) async throws(RedisError) {
        let command = due.map { RedisCommand("ZADD", [dueKey(partition: partition), $0, member]) }
            ?? RedisCommand("ZREM", [dueKey(partition: partition), member])
        _ = try await client.send(command)
    }

    /// Ends a claim after its outcome was published, and drops its due-index member.
    func release(partition: Int32, token: String, topic: String, id: String) async throws(RedisError) {
        let replies = try await client.pipelineLoading([Self.releaseScript], [
            RedisCommand.evalsha(Self.releaseScript, keys: [Self.mailboxKey(token: token, topic: topic)], arguments: [id]),
            RedisCommand("ZREM", [dueKey(partition: partition), Self.member(token: token, topic: topic, id: id)]),
        ])
        for reply in replies { if case .error(let message) = reply { throw .server(message) } }
    }
}
