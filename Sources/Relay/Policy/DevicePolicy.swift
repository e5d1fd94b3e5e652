import Foundation
import Kafka
import Redis

/// Per-device rules kept in Redis: dedupe, the token bucket, 429 backoff and the mailbox
/// (store-and-forward of the newest intent that could not go out yet). The keys and what they
/// hold: ``RedisKeys``.
struct DevicePolicy: Sendable {
    let client: RedisClient
    /// The keys, under `redis.key_prefix`.
    let keys: RedisKeys
    /// `kafka.intents_topic` (with lanes, the first lane's): the lane of a mailbox entry that
    /// names none.
    let intentsTopic: String
    /// 429 backoff: the first wait, doubling while 429s repeat, up to the maximum.
    let backoffBaseMilliseconds: Int64
    let backoffMaximumMilliseconds: Int64
    /// `redis.park_min_replicas`, and how long a park waits for them (ms): each park and its
    /// due-index write are followed by `WAIT` on their connection, and fewer replicas than
    /// asked fail the park (``RedisError/server(_:)`` `NOREPLICAS`, an outage: it is tried
    /// again, and the intent's offset stays uncommitted meanwhile).
    var parkReplicas: (count: Int, timeoutMilliseconds: Int) = (0, 0)
    /// How long a mailbox entry being sent stays claimed before another attempt may take it
    /// (`policy.mailbox_claim_lease_seconds`).
    var claimLeaseMilliseconds: Int64 = 120_000

    /// The due index of an intents partition (one per lane's partition).
    func dueKey(partition: TopicPartition) -> String { keys.due(intentsTopic: partition.topic, partition: partition.partition) }

    /// The intents partition a mailbox entry came from.
    func partition(of entry: Entry) -> TopicPartition {
        TopicPartition(topic: entry.lane ?? intentsTopic, partition: entry.partition)
    }

    /// `kafka.lanes` is set: every entry names its lane.
    var namesLanes = false

    /// What a mailbox entry records as its lane: with `kafka.lanes`, its topic; with one lane
    /// nothing (a relay with one lane writes entries as it always did). An entry found in a
    /// due index belongs to that index's partition whatever it names (one parked before lanes
    /// were configured names none).
    func entryLane(_ topic: String) -> String? {
        namesLanes || topic != intentsTopic ? topic : nil
    }

    // MARK: Scripts (Scripts/*.lua; each mailbox script starts with mark_waiting.lua)

    /// Parks an intent in its mailbox, displacing the one parked there (whose entry it returns),
    /// unless the mailbox holds a newer intent of the partition, parked or being sent (the one
    /// parking is a redelivery): then the one parking is displaced. With a 429, starts or
    /// lengthens the device's backoff first (doubling while 429s repeat, kept until its end plus
    /// the maximum, so that the level is remembered).
    /// KEYS: mailbox, backoff, waiting. ARGV: id, entry, expiration (s), due ms, now ms, "1"
    /// for a 429, backoff base ms, backoff maximum ms, the intent's stored trace context (empty:
    /// none; kept as `t:<id>` while it is parked or claimed), hand-over lease ms, owner
    /// (``handOverOwner()``). A displaced entry stays as `d:<id>`, what displaced it as
    /// `db:<id>`, until its `coalesced` outcome is acknowledged. Answers
    /// {due ms, {id, entry, by, mine, lease end, ...}, keeper}:
    /// every displaced entry whose `coalesced` outcome is not acknowledged yet
    /// (``acknowledgeDisplaced(_:token:topic:)``), this park's included, leased to this park
    /// where no other hand-over's lease runs (Scripts/displaced.lua), and the id the
    /// mailbox keeps (the one parking, or the newer one that displaced it: then the due time
    /// answered is not the one parking's, and a claim the one parking held ends).
    static let parkScript = RedisScript(RedisScripts.source(PackageResources.mark_waiting_lua, PackageResources.displaced_lua,
                                                            PackageResources.backoff_lua, PackageResources.park_lua))

    /// Moves a device's 429 backoff as a park after a 429 does (Scripts/backoff.lua), parking
    /// nothing: shadow mode's 429. KEYS: backoff. ARGV: now ms, base ms, maximum ms. Answers
    /// when the backoff ends.
    static let noteBackoffScript = RedisScript(RedisScripts.source(PackageResources.backoff_lua, PackageResources.note_backoff_lua))

    /// Takes a due mailbox entry for sending, if the device may be sent to now (spending a
    /// token as an admission does, see ``DeviceAdmission/Bucket``).
    /// KEYS: mailbox, rate, the entry's seen key, backoff, waiting. ARGV: id, now ms, burst,
    /// interval ms, lease ms, owner (``handOverOwner()``). Answers ``Take``'s codes: {0} stale,
    /// {1, entry, trace, record} answered before, {2, due} not yet (or claimed under a lease
    /// that runs until `due`: a claim never loses its index member while its lease runs; or
    /// displaced and under another hand-over's lease), {3, entry, trace} claimed,
    /// {4, entry, trace} expired, {7, entry, displaced by} displaced and now leased to this take
    /// for its `coalesced` outcome; `trace` is the entry's stored trace context, or nil. Answered,
    /// expired and claimed entries all become the take's claim, removed by the release once
    /// their outcome is out.
    static let takeScript = RedisScript(RedisScripts.source(PackageResources.mark_waiting_lua, PackageResources.take_lua))

    /// Hands over a mailbox's displaced entries (Scripts/displaced.lua, hand_over.lua): see
    /// ``handOver(token:topic:now:owner:)``.
    static let handOverScript = RedisScript(RedisScripts.source(PackageResources.displaced_lua, PackageResources.hand_over_lua))

    /// Moves a claimed entry no relay can read to its quarantine key (Scripts/quarantine.lua).
    static let quarantineScript = RedisScript(RedisScripts.source(PackageResources.mark_waiting_lua, PackageResources.quarantine_lua))
    /// How long a quarantined entry is kept for someone to look at.
    static let quarantineMilliseconds: Int64 = 30 * 86_400_000

    /// Ends a claim once the claimed intent's outcome is published. KEYS: mailbox, waiting.
    /// ARGV: id.
    static let releaseScript = RedisScript(RedisScripts.source(PackageResources.mark_waiting_lua, PackageResources.release_lua))

    // MARK: Mailbox calls

    /// An intent parked in a mailbox, as stored: where it came from, when it was consumed,
    /// its expiration (resolved when it was consumed) and the message itself. Stored as one
    /// header line, `<partition> <offset> <consumed at ms> <expiration s>[ <lane topic>]`, then
    /// the message.
    struct Entry: Sendable {
        var partition: Int32
        var offset: Int64
        var consumedAt: Int64
        var expiration: Int64
        var message: [UInt8]
        /// The intents topic it came from: with `kafka.lanes` always, with one lane never
        /// (``entryLane(_:)``).
        var lane: String? = nil
        /// Its intent's trace context (``RelayPipeline/storedTrace(_:)``), kept beside the
        /// entry (field `t:<id>`), not in it.
        var trace: [UInt8]? = nil

        var encoded: [UInt8] {
            Array("\(partition) \(offset) \(consumedAt) \(expiration)\(lane.map { " " + $0 } ?? "")\n".utf8) + message
        }

        init(partition: Int32, offset: Int64, consumedAt: Int64, expiration: Int64, message: [UInt8]) {
            self.partition = partition
            self.offset = offset
            self.consumedAt = consumedAt
            self.expiration = expiration
            self.message = message
        }

        /// Times past the year 9999 (or before 1970) are not ones the relay wrote (see
        /// ``Intent/latestExpiration``): such an entry is unreadable, so that no arithmetic on it
        /// can overflow.
        static let latestMilliseconds: Int64 = (Intent.latestExpiration + 1) * 1000

        init?(_ bytes: [UInt8]) {
            guard let newline = bytes.firstIndex(of: UInt8(ascii: "\n")) else { return nil }
            let header = String(decoding: bytes[..<newline], as: UTF8.self).split(separator: " ")
            guard header.count == 4 || header.count == 5, let partition = Int32(header[0]), partition >= 0, let offset = Int64(header[1]),
                  let consumedAt = Int64(header[2]), (0...Self.latestMilliseconds).contains(consumedAt),
                  let expiration = Int64(header[3]), (0...Intent.latestExpiration).contains(expiration) else { return nil }
            self.init(partition: partition, offset: offset, consumedAt: consumedAt, expiration: expiration,
                      message: Array(bytes[(newline + 1)...]))
            lane = header.count == 5 ? String(header[4]) : nil
        }
    }

    /// An entry displaced from a mailbox whose `coalesced` outcome is not out yet, as a
    /// hand-over answers it (Scripts/displaced.lua).
    struct Displaced: Sendable {
        var id: String
        var entry: Entry
        /// The intent that displaced it, when the mailbox recorded one.
        var by: String?
        /// Leased to this hand-over, which publishes its outcome and acknowledges it
        /// (``acknowledgeDisplaced(_:token:topic:)``); else another hand-over's lease runs.
        var mine: Bool
        /// The end of that lease: its due-index member stands there, so that if the relay
        /// holding the lease dies, the partition's poll hands it over then.
        var leaseEnds: Int64
    }

    /// A 429 for `token` in shadow mode: its backoff moves as enforce mode's park would move it
    /// (``noteBackoffScript``), so that shadow mode's later admissions decide as enforce mode's.
    func noteBackoff(token: String, now: Int64) async throws(RedisError) -> Int64 {
        let replies = try await client.pipelineLoading([Self.noteBackoffScript], [
            RedisCommand.evalsha(Self.noteBackoffScript, keys: [keys.backoff(token: token)],
                                 arguments: [now, backoffBaseMilliseconds, backoffMaximumMilliseconds]),
        ])
        guard let until = replies[0].integer else {
            if case .error(let message) = replies[0] { throw .server(message) }
            throw .protocolError("the backoff script answered \(replies[0])")
        }
        return until
    }

    /// A hand-over's owner, for the leases of the displaced entries it is handed: the same
    /// across the tries of one park or hand-over (a reply lost and asked again), new for the next.
    static func handOverOwner() -> String { String(UInt64.random(in: 1...UInt64.max), radix: 36) }

    /// Parks an intent (see ``parkScript``) and indexes it; answers the entries displaced, the
    /// ids of those no relay can read (for ``quarantine(partition:token:topic:id:)``),
    /// and the id the mailbox keeps (`id`, or a newer intent that displaced it: then nothing is
    /// indexed). `owner`: ``handOverOwner()``, the same when the park is asked again.
    func park(token: String, topic: String, id: String, entry: Entry, due: Int64, now: Int64, tooManyRequests: Bool,
              owner: String) async throws(RedisError) -> (due: Int64, displaced: [Displaced], unreadable: [String], keeper: String) {
        let call = RedisCommand.evalsha(Self.parkScript, keys: [keys.mailbox(token: token, topic: topic), keys.backoff(token: token),
                                                                keys.waiting(token: token, topic: topic)],
                                        arguments: [id, entry.encoded, entry.expiration, due, now, tooManyRequests ? "1" : "0",
                                                    backoffBaseMilliseconds, backoffMaximumMilliseconds, entry.trace ?? [],
                                                    claimLeaseMilliseconds, owner])
        let replicated = parkReplicas.count > 0 ? [RedisCommand("WAIT", [parkReplicas.count, parkReplicas.timeoutMilliseconds])] : []
        let replies = try await client.pipelineLoading([Self.parkScript], [call], then: replicated)
        let reply = replies[0]
        if case .error(let message) = reply { throw .server(message) }
        try checkReplicas(replies.dropFirst())
        guard case .array(let values) = reply, values.count == 3, let parkedDue = values[0].integer,
              let keeper = values[2].string else {
            throw .protocolError("park script answered \(reply)")
        }
        let (displaced, unreadable) = Self.displaced(values[1])
        var indexing = displacedIndexing(displaced, token: token, topic: topic)
        if keeper == id {
            // Indexed after the mailbox write (the two keys are in different hash slots): a
            // crash between the two leaves the intent's offset uncommitted, and its redelivery,
            // which finds it in the mailbox, indexes it (``ensureIndexed``).
            indexing.insert(RedisCommand("ZADD", [dueKey(partition: partition(of: entry)), parkedDue,
                                                  RedisKeys.member(token: token, topic: topic, id: id)]), at: 0)
        }
        if !indexing.isEmpty {
            let indexed = try await client.pipeline(indexing + replicated)
            for reply in indexed.prefix(indexing.count) { if case .error(let message) = reply { throw .server(message) } }
            try checkReplicas(indexed.dropFirst(indexing.count))
        }
        return (parkedDue, displaced, unreadable, keeper)
    }

    /// The displaced entries of a hand-over's answer ({id, entry, by, mine, lease end, ...}), and
    /// the ids of those whose entry no relay can read: no due index can hold them (their
    /// partition is in the entry), so the hand-over moves them aside, under whichever lease
    /// (another hand-over can do nothing else with them; moving one aside twice moves it once).
    private static func displaced(_ reply: RESPValue) -> (readable: [Displaced], unreadable: [String]) {
        let values = reply.array ?? []
        var displaced: [Displaced] = [], unreadable: [String] = []
        for index in stride(from: 0, to: values.count - 4, by: 5) {
            guard let id = values[index].string, let mine = values[index + 3].integer,
                  let leaseEnds = values[index + 4].integer else { continue }
            guard let entry = values[index + 1].bytes.flatMap(Entry.init) else {
                unreadable.append(id)
                continue
            }
            let by = values[index + 2].string.flatMap { $0.isEmpty ? nil : $0 }
            displaced.append(Displaced(id: id, entry: entry, by: by, mine: mine == 1, leaseEnds: leaseEnds))
        }
        return (displaced, unreadable)
    }

    /// Each displaced entry's due-index member, at its hand-over lease's end.
    private func displacedIndexing(_ displaced: [Displaced], token: String, topic: String) -> [RedisCommand] {
        displaced.map {
            RedisCommand("ZADD", [dueKey(partition: partition(of: $0.entry)), $0.leaseEnds, RedisKeys.member(token: token, topic: topic, id: $0.id)])
        }
    }

    /// Throws when a `WAIT` after a park heard from fewer replicas than `redis.park_min_replicas`.
    private func checkReplicas(_ replies: ArraySlice<RESPValue>) throws(RedisError) {
        guard parkReplicas.count > 0, let reply = replies.first else { return }
        if case .error(let message) = reply { throw .server(message) }
        let acknowledged = reply.integer ?? 0
        guard acknowledged >= Int64(parkReplicas.count) else {
            throw .server("NOREPLICAS the park reached \(acknowledged) of \(parkReplicas.count) replicas within \(parkReplicas.timeoutMilliseconds) ms")
        }
    }

    /// Hands over what a device's mailbox holds displaced (Scripts/hand_over.lua): the entries
    /// whose `coalesced` outcome is not out, leased to `owner` where no other hand-over's lease
    /// runs, each one's due-index member moved to its lease's end; and the intent the mailbox
    /// holds now (parked, else being sent), for an entry that does not name what displaced it.
    /// Entries no relay can read come back as ids, for ``quarantine(partition:token:topic:id:)``.
    func handOver(token: String, topic: String, now: Int64,
                  owner: String) async throws(RedisError) -> (holder: String?, entries: [Displaced], unreadable: [String]) {
        let reply = try await client.evaluate(Self.handOverScript, keys: [keys.mailbox(token: token, topic: topic)],
                                              arguments: [now, claimLeaseMilliseconds, owner])
        if case .error(let message) = reply { throw .server(message) }
        guard case .array(let values) = reply, values.count == 2, let holder = values[0].string else {
            throw .protocolError("hand-over script answered \(reply)")
        }
        let (entries, unreadable) = Self.displaced(values[1])
        let indexing = displacedIndexing(entries, token: token, topic: topic)
        if !indexing.isEmpty {
            for reply in try await client.pipeline(indexing) { if case .error(let message) = reply { throw .server(message) } }
        }
        return (holder.isEmpty ? nil : holder, entries, unreadable)
    }

    /// The `coalesced` outcome of a displaced entry is out: it leaves the mailbox, and its
    /// due-index member goes.
    func acknowledgeDisplaced(_ displaced: Displaced, token: String, topic: String) async throws(RedisError) {
        let id = displaced.id
        let replies = try await client.pipeline([
            RedisCommand("HDEL", [keys.mailbox(token: token, topic: topic), "d:" + id, "db:" + id, "dl:" + id, "t:" + id]),
            RedisCommand("ZREM", [dueKey(partition: partition(of: displaced.entry)), RedisKeys.member(token: token, topic: topic, id: id)]),
        ])
        for reply in replies { if case .error(let message) = reply { throw .server(message) } }
    }

    /// Mailbox members of these partitions due by `now`, at most `limit` per partition, and the
    /// first error reply of a partition whose index could not be read (a Redis Cluster node in
    /// trouble answers for its slots only: the other partitions are taken from all the same).
    /// Throws when the round trip failed, or when every partition's read did.
    func due(partitions: [TopicPartition], now: Int64, limit: Int) async throws(RedisError)
        -> (due: [(partition: TopicPartition, member: String)], failed: RedisError?) {
        guard !partitions.isEmpty else { return ([], nil) }
        let replies = try await client.pipeline(partitions.map {
            RedisCommand("ZRANGEBYSCORE", [dueKey(partition: $0), "-inf", now, "LIMIT", 0, limit])
        })
        var due: [(TopicPartition, String)] = []
        var failed: RedisError?, failures = 0
        for (partition, reply) in zip(partitions, replies) {
            if case .error(let message) = reply {
                failed = failed ?? .server(message)
                failures += 1
                continue
            }
            guard case .array(let members) = reply else { continue }
            for member in members { if let text = member.string { due.append((partition, text)) } }
        }
        if failures == partitions.count, let failed { throw failed }
        return (due, failed)
    }

    enum Take {
        case stale
        case answered(Entry, AnswerRecord?)
        case notYet(due: Int64)
        case claimed(Entry)
        case expired(Entry)
        /// A parked entry behind the claim of another intent whose lease ran out (its relay
        /// died, or the answer to its take was lost): that intent is older and unanswered, and
        /// is taken first.
        case behindAbandonedClaim(id: String)
        /// A parked entry behind another intent's claim that still runs, until `until` (the end
        /// of that claim's lease) at the latest: the claim's release moves it up.
        case behindClaim(until: Int64)
        /// Claimed (or a displaced entry taken for its hand-over), but no relay can read it (its
        /// header is not one a relay wrote): for ``quarantine(partition:token:topic:id:)``.
        case unreadable
        /// Displaced from its mailbox, its `coalesced` outcome not out (the relay handing it
        /// over died, or failed to publish): leased to this take, to hand over.
        case displaced(Displaced)
    }

    /// Tries to take a due entry for sending; its index member first moves to the end of the
    /// claim's lease, so that if this relay dies with the entry claimed, the partition's next
    /// owner takes it again then.
    func take(partition: TopicPartition, token: String, topic: String, id: String, rules: RelayConfiguration.Policy.Rules,
              now: Int64, owner: String = handOverOwner()) async throws(RedisError) -> Take {
        let member = RedisKeys.member(token: token, topic: topic, id: id)
        let limit = rules.rateLimit
        let replies = try await client.pipelineLoading([Self.takeScript], [
            RedisCommand("ZADD", [dueKey(partition: partition), now + claimLeaseMilliseconds, member]),
            RedisCommand.evalsha(Self.takeScript,
                                 keys: [keys.mailbox(token: token, topic: topic), keys.rate(token: token),
                                        keys.seen(token: token, topic: topic, id: id), keys.backoff(token: token),
                                        keys.waiting(token: token, topic: topic)],
                                 arguments: [id, now, limit.isEnabled ? limit.burst : 0, limit.intervalMilliseconds,
                                             claimLeaseMilliseconds, owner]),
        ])
        for case .error(let message) in replies { throw .server(message) }
        guard case .array(let values) = replies[1], let code = values.first?.integer else {
            throw .protocolError("take script answered \(replies[1])")
        }
        func entry() -> Entry? {
            guard values.count >= 2, let bytes = values[1].bytes, var entry = Entry(bytes) else { return nil }
            entry.trace = values.count > 2 ? values[2].bytes : nil
            return entry
        }
        switch code {
        case 0: return .stale
        case 1: return entry().map { .answered($0, values.count > 3 ? values[3].string.flatMap(AnswerRecord.init) : nil) } ?? .unreadable
        case 2:
            guard values.count == 2, let due = values[1].integer else { throw .protocolError("take script answered \(replies[1])") }
            return .notYet(due: due)
        case 3: return entry().map { .claimed($0) } ?? .unreadable
        case 4: return entry().map { .expired($0) } ?? .unreadable
        case 5:
            guard values.count == 2, let other = values[1].string else { throw .protocolError("take script answered \(replies[1])") }
            return .behindAbandonedClaim(id: other)
        case 6:
            guard values.count == 2, let until = values[1].integer else { throw .protocolError("take script answered \(replies[1])") }
            return .behindClaim(until: until)
        case 7:
            guard values.count == 3, let by = values[2].string else { throw .protocolError("take script answered \(replies[1])") }
            guard let bytes = values[1].bytes, let entry = Entry(bytes) else { return .unreadable }
            return .displaced(Displaced(id: id, entry: entry, by: by.isEmpty ? nil : by, mine: true, leaseEnds: now + claimLeaseMilliseconds))
        default: throw .protocolError("take script answered \(replies[1])")
        }
    }

    /// Moves an unreadable claimed (or displaced) entry out of its mailbox into
    /// `<prefix>quarantine:{<token>}:<topic>:<id>` (kept 30 days) and its member out of the due
    /// index of `partition` (nil: no index holds it): it is no outage, and no poll takes it again.
    /// False when the entry no longer holds the claim (another take, a release) and is no
    /// displaced entry: nothing moved.
    func quarantine(partition: TopicPartition?, token: String, topic: String, id: String) async throws(RedisError) -> Bool {
        let moved = try await client.evaluate(Self.quarantineScript,
                                              keys: [keys.mailbox(token: token, topic: topic), keys.waiting(token: token, topic: topic),
                                                     keys.quarantine(token: token, topic: topic, id: id)],
                                              arguments: [id, Self.quarantineMilliseconds])
        guard moved.integer == 1 else { return false }
        if let partition {
            try await reindex(partition: partition, member: RedisKeys.member(token: token, topic: topic, id: id), due: nil)
        }
        return true
    }

    /// Moves a member to a new due time, or removes it (nil); with `onlyEarlier`, only if that
    /// is earlier than where it stands (`ZADD LT`: a move up made meanwhile stays).
    func reindex(partition: TopicPartition, member: String, due: Int64?, onlyEarlier: Bool = false) async throws(RedisError) {
        let command = due.map { RedisCommand("ZADD", [dueKey(partition: partition)] + (onlyEarlier ? ["LT"] : []) + [$0, member]) }
            ?? RedisCommand("ZREM", [dueKey(partition: partition), member])
        _ = try await client.send(command)
    }

    /// Puts a mailbox entry's member back into the due index if it is missing (`ZADD NX`, due
    /// `now`: the take then says when it is really due), leaving a present one as it is. For
    /// a redelivered intent its mailbox holds: the index write after the park may never have
    /// happened (the relay died, or lost the partition, between the two).
    ///
    /// With `redis.park_min_replicas`, it counts as parked only once that many replicas have the
    /// mailbox and its index entry, as a park does (its own acknowledgement may never have come):
    /// a write to the mailbox that changes nothing (so that this connection's `WAIT` covers the
    /// park's writes before it), the index write, then `WAIT`; fewer replicas throw.
    func ensureIndexed(partition: TopicPartition, token: String, topic: String, id: String, now: Int64) async throws(RedisError) {
        let index = RedisCommand("ZADD", [dueKey(partition: partition), "NX", now, RedisKeys.member(token: token, topic: topic, id: id)])
        guard parkReplicas.count > 0 else {
            _ = try await client.send(index)
            return
        }
        let touch = RedisCommand("EVAL", [Self.touchMailbox, 1, keys.mailbox(token: token, topic: topic)])
        let replies = try await client.pipeline([touch, index, RedisCommand("WAIT", [parkReplicas.count, parkReplicas.timeoutMilliseconds])])
        for reply in replies.prefix(2) { if case .error(let message) = reply { throw .server(message) } }
        try checkReplicas(replies.dropFirst(2))
    }

    /// Rewrites a mailbox's due time as it is (`HINCRBY … 0`): a replicated write that changes
    /// nothing, and creates no mailbox that is gone.
    static let touchMailbox = "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'pd', 0) end return 1"

    /// Ends a claim after its outcome was published, and drops its due-index member. An entry
    /// parked behind the claim waited for it (its member stands at the claim's lease end): its
    /// member moves up to its own due time, or now.
    func release(partition: TopicPartition, token: String, topic: String, id: String, now: Int64) async throws(RedisError) {
        let replies = try await client.pipelineLoading([Self.releaseScript], [
            RedisCommand.evalsha(Self.releaseScript, keys: [keys.mailbox(token: token, topic: topic), keys.waiting(token: token, topic: topic)],
                                 arguments: [id]),
            RedisCommand("ZREM", [dueKey(partition: partition), RedisKeys.member(token: token, topic: topic, id: id)]),
        ])
        for reply in replies { if case .error(let message) = reply { throw .server(message) } }
        guard case .array(let parked) = replies[0], parked.count == 2, let next = parked[0].string, let due = parked[1].integer else { return }
        // LT: only ever earlier (a member already due sooner stays); added when missing.
        _ = try await client.send(RedisCommand("ZADD", [dueKey(partition: partition), "LT", max(due, now),
                                                        RedisKeys.member(token: token, topic: topic, id: next)]))
    }
}
