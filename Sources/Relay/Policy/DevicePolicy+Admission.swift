import Foundation
import Redis

/// Admission: what Redis holds for a batch's intents (one `MGET` per device and topic), and the
/// decisions taken from it (``decide``, pure) with the device's token bucket.
extension DevicePolicy {
    /// What a device and app's mailbox holds, as an intent being admitted sees it.
    enum MailboxHolds: Equatable {
        case nothing
        /// The intent itself, parked or being sent (it is a redelivery).
        case thisIntent
        /// An older intent, parked or being sent: the one being admitted must not overtake it.
        case anotherIntent
    }

    /// What the ids of a `waiting` value say about the intent `id`. A value that does not read
    /// so (Redis holds whatever was written there) names no id.
    static func mailbox(_ value: [UInt8]?, holdsFor id: String) -> MailboxHolds {
        guard let value, let colon = value.firstIndex(of: UInt8(ascii: ":")),
              let length = Int(String(decoding: value[..<colon], as: UTF8.self)),
              length >= 0, length <= value.count - colon - 1 else { return .nothing }
        let pid = value[(colon + 1)..<(colon + 1 + length)], cid = value[(colon + 1 + length)...]
        if (!pid.isEmpty && pid.elementsEqual(id.utf8)) || (!cid.isEmpty && cid.elementsEqual(id.utf8)) { return .thisIntent }
        return pid.isEmpty && cid.isEmpty ? .nothing : .anotherIntent
    }

    enum Admission: Equatable {
        /// A token was taken.
        case send
        /// APNs answered it before (what it answered, from the record): outcome `duplicate`.
        case duplicate(AnswerRecord?)
        /// It is in its mailbox already (a redelivery): the mailbox will answer it.
        case inMailbox
        /// The device may not be sent to now: park it (or, with expiration 0, give up).
        case wait
        /// A newer intent of its collapse id (at this position of the group) goes in its place.
        case coalesced(into: Int)
        /// APNs answered 410 for the pair at this time (epoch ms), after the intent's token was
        /// registered (or it does not say when): outcome `unregistered`, nothing sent.
        case knownUnregistered(at: Int64)
    }

    /// One device and topic's intents of a batch.
    struct Group {
        let token: String
        let topic: String
        let rules: RelayConfiguration.Policy.Rules
        /// The intents in batch order.
        private(set) var ids: [String] = []
        /// For each intent, whether it is now-or-never (expiration 0: it cannot wait).
        private(set) var nowOrNever: [Bool] = []
        /// For each intent, its `token_registered_at`.
        private(set) var registeredAt: [Int64?] = []
        /// For each intent, its expiration (epoch s).
        private(set) var expirations: [Int64] = []
        /// The pair's remembered 410 is read (every group of a device's token, not of a channel):
        /// without the option a delivery deletes it only where the read found it (``Decided``).
        var readsUnregistered = false
        /// The remembered 410 decides (`policy.skip_known_unregistered`): an intent it applies to
        /// is `knownUnregistered`.
        var skipsKnownUnregistered = false
        /// For each intent, the position of the newest intent of its collapse id when that is
        /// another one (nil for the newest and for intents that do not collapse).
        var collapsesInto: [Int?] = []

        init(token: String, topic: String, rules: RelayConfiguration.Policy.Rules) {
            self.token = token
            self.topic = topic
            self.rules = rules
        }

        /// Adds the next intent; answers its position.
        mutating func append(_ id: String, nowOrNever: Bool, registeredAt: Int64? = nil, expiration: Int64 = Intent.latestExpiration) -> Int {
            ids.append(id)
            self.nowOrNever.append(nowOrNever)
            self.registeredAt.append(registeredAt)
            expirations.append(expiration)
            collapsesInto.append(nil)
            return ids.count - 1
        }
    }

    /// One group's decisions, from what Redis holds: its mailbox's ids, the device's backoff and
    /// bucket, the pair's remembered 410 (`unregisteredAt`), and the dedupe record of the intent
    /// at a position (nil: none; a nil record: one that does not read).
    ///
    /// An intent the remembered 410 applies to (its `token_registered_at` absent or not newer)
    /// is `knownUnregistered` unless it is a duplicate or in the mailbox already; it cannot be
    /// delivered, so an older intent of its collapse id is tried in its place.
    ///
    /// Intents are decided in batch order, each collapse id once, at its newest intent's place:
    /// the newest that can still be delivered survives (sent, parked, in the mailbox already,
    /// or delivered before) and the older ones are `coalesced` into it; a newest that cannot (a
    /// now-or-never one the device cannot take now, or one APNs refused before) gets its own
    /// answer and the next older one is tried. An older one that would have to wait while a
    /// newer intent of the group goes out now is `coalesced` into that one instead: it would
    /// reach the device after it. Only a sent intent spends a token.
    static func decide(_ group: Group, waiting: [UInt8]?, backoffUntil: Int64, bucket: inout Bucket, now: Int64,
                       unregisteredAt: Int64? = nil, record: (Int) -> AnswerRecord??) -> [Admission] {
        var decisions = Array(repeating: Admission.wait, count: group.ids.count)
        // The older intents of each collapse id, newest first, by the position of the newest.
        var older: [Int: [Int]] = [:]
        for (position, into) in group.collapsesInto.enumerated() {
            if let into { older[into, default: []].insert(position, at: 0) }
        }
        /// Decides one intent; true when it survives its collapse id (it can still be delivered).
        func decideOne(_ position: Int) -> Bool {
            let holds = mailbox(waiting, holdsFor: group.ids[position])
            let decision: Admission
            if let record = record(position) {
                decision = .duplicate(record)
            } else if holds == .thisIntent {
                decision = .inMailbox
            } else if let unregisteredAt, (group.registeredAt[position] ?? .min) <= unregisteredAt {
                decision = .knownUnregistered(at: unregisteredAt)
            } else if holds == .anotherIntent || now < backoffUntil || !bucket.spend() {
                // Behind an older intent of its mailbox it waits there too (taking the older
                // one's place when that one is only parked): partition order.
                decision = .wait
            } else {
                decision = .send
            }
            decisions[position] = decision
            return switch decision {
            case .send, .inMailbox: true
            case .duplicate(let record): record == nil || record?.status == Outcome.Status.delivered.rawValue
            case .wait: !group.nowOrNever[position]
            case .coalesced, .knownUnregistered: false
            }
        }
        /// The newest intent decided so far that goes out now.
        var lastSent: Int?
        for position in group.ids.indices where group.collapsesInto[position] == nil {
            let olderOnes = older[position] ?? []
            var survivor = decideOne(position) ? position : nil
            for candidate in olderOnes {
                if let survivor {
                    decisions[candidate] = .coalesced(into: survivor)
                } else if decideOne(candidate) {
                    // An older intent that must wait while a newer one goes out now would reach
                    // the device after it: the newer one supersedes it (as in the mailbox).
                    if decisions[candidate] == .wait, let lastSent, lastSent > candidate {
                        decisions[candidate] = .coalesced(into: lastSent)
                        survivor = lastSent
                    } else {
                        survivor = candidate
                    }
                }
            }
            if decisions[position] == .send { lastSent = position }
            if let survivor, decisions[survivor] == .send { lastSent = max(lastSent ?? survivor, survivor) }
        }
        return decisions
    }

    /// The admission of a batch's groups, asked when ``PendingAdmission/get(now:)`` is called.
    func admission(_ groups: [Group]) -> PendingAdmission {
        PendingAdmission(policy: self, groups: groups)
    }

    /// One group's answer: its intents' decisions, when the device may be sent to next, and
    /// whether a delivery of its intents deletes the pair's remembered 410: where Redis held one
    /// when read, where it was not read, and always with `policy.skip_known_unregistered` (then
    /// this relay itself may remember one after the read, for an earlier intent of the pair
    /// still at APNs). Without the option this relay remembers none, so a read that found none
    /// leaves nothing for the delivery to delete.
    struct Decided: Sendable {
        var decisions: [Admission]
        var due: Int64
        var forgetsUnregistered = true
    }

    /// A batch's admission: one round trip of plain reads for the whole batch (per device and
    /// topic one `MGET` of the bucket, the backoff, the mailbox's ids, the intents' dedupe
    /// records and the pair's remembered 410), the
    /// decisions taken here, and the buckets' new arrival times written after them in a second
    /// round trip on the same connection, whose replies are checked (a group whose write failed
    /// fails as a failed read does).
    ///
    /// Batches are admitted one after another on one connection, so a batch reads what the
    /// batches before it wrote. What this gives up against one script per device: a mailbox
    /// take, or another relay admitting the same device, between one batch's read and its write
    /// is not seen, so one extra send per such overlap can pass the bucket. Intents keyed by
    /// token are consumed by one relay at a time, so that overlap needs a partition handover.
    struct PendingAdmission: Sendable {
        let policy: DevicePolicy
        let groups: [Group]

        /// The decisions for every group at `now` (epoch ms), for each the time the device
        /// may be sent to next, and whether their deliveries delete the pair's remembered 410
        /// (``Decided/forgetsUnregistered``); a group whose read Redis answered with an error (its keys' slot
        /// being migrated in a Redis Cluster, say) has that error instead, and the others are
        /// decided all the same. Throws when the round trip itself failed. Asked again after a
        /// failure, it reads again.
        func get(now: Int64) async throws(RedisError) -> [Result<Decided, RedisError>] {
            guard !groups.isEmpty else { return [] }
            var reads = RedisCommandBuffer(reservingBytes: 256 * groups.count)
            let keys = policy.keys
            for group in groups {
                let token = group.token, topic = group.topic, ids = group.ids
                reads.append("MGET") { command in
                    command.appendArgument { keys.writeRate(&$0, token: token) }
                    command.appendArgument { keys.writeBackoff(&$0, token: token) }
                    command.appendArgument { keys.writeWaiting(&$0, token: token, topic: topic) }
                    for id in ids { command.appendArgument { keys.writeSeen(&$0, token: token, topic: topic, id: id) } }
                    if group.readsUnregistered { command.appendArgument { keys.writeUnregistered(&$0, token: token, topic: topic) } }
                    if group.rules.mode == .shadow { command.appendArgument { keys.writeShadowWaiting(&$0, token: token, topic: topic) } }
                }
            }
            let replies = try await policy.client.submit(reads).get()
            guard replies.count == groups.count else {
                throw .protocolError("\(replies.count) replies to \(groups.count) admission reads")
            }
            var answers: [Result<Decided, RedisError>] = []
            answers.reserveCapacity(groups.count)
            var writes = RedisCommandBuffer(reservingBytes: 64 * groups.count)
            // Per bucket write, the answer it belongs to.
            var written: [Int] = []
            for (index, group) in groups.enumerated() {
                let stored = replies[index]
                if case .error(let message) = stored {
                    answers.append(.failure(.server(message)))
                    continue
                }
                let shadow = group.rules.mode == .shadow
                guard let values = stored.array,
                      values.count == 3 + group.ids.count + (group.readsUnregistered ? 1 : 0) + (shadow ? 1 : 0) else {
                    throw .protocolError("MGET answered \(stored)")
                }
                var bucket = Bucket(group.rules.rateLimit, stored: values[0].integer, now: now)
                let backoffUntil = Bucket.backoff(values[1].string)?.until ?? 0
                // A value that does not read as a time (Redis holds whatever was written) is
                // no remembered 410: the intent is sent and APNs answers.
                let unregistered = group.readsUnregistered ? values[3 + group.ids.count] : nil
                let unregisteredAt = group.skipsKnownUnregistered ? unregistered?.integer : nil
                // In shadow mode the mailbox enforce mode would have (``ShadowMailbox``), unless
                // the real one holds an intent (parked before a switch to shadow mode).
                let mailbox = values[2].bytes
                let shadowMailbox = shadow && (values[values.count - 1].integer ?? .min) > now ? ShadowMailbox.note : nil
                // Parsed for shadow mode only: enforce mode reads the mailbox as it is.
                let holdsParked = shadow && DevicePolicy.mailbox(mailbox, holdsFor: "") != .nothing
                let decisions = DevicePolicy.decide(group, waiting: holdsParked ? mailbox : shadowMailbox ?? mailbox,
                                                    backoffUntil: backoffUntil, bucket: &bucket, now: now,
                                                    unregisteredAt: unregisteredAt) { position in
                    let record = values[3 + position]
                    return record.isNull ? nil : .some(record.string.flatMap(AnswerRecord.init))
                }
                if shadow, !holdsParked,
                   let until = ShadowMailbox.noting(group, decisions, held: shadowMailbox, backoffUntil: backoffUntil, bucket: &bucket) {
                    let token = group.token, topic = group.topic
                    writes.append("SET") { command in
                        command.appendArgument { keys.writeShadowWaiting(&$0, token: token, topic: topic) }
                        command.append(until)
                        command.append("PX")
                        command.append(max(1, until - now) + 60_000)
                    }
                    written.append(answers.count)
                }
                if let arrival = bucket.spent {
                    let token = group.token
                    writes.append("SET") { command in
                        command.appendArgument { keys.writeRate(&$0, token: token) }
                        command.append(arrival)
                        command.append("PX")
                        command.append(arrival - now + 60_000)
                    }
                    written.append(answers.count)
                }
                answers.append(.success(Decided(decisions: decisions, due: max(backoffUntil, bucket.due),
                                                forgetsUnregistered: group.skipsKnownUnregistered || (unregistered.map { !$0.isNull } ?? true))))
            }
            // The buckets are spent before anything is sent: a write Redis refuses (a replica
            // that was a master, `READONLY`; a full `noeviction` server, `OOM`; a slot moved)
            // fails its group as a failed read does, so nothing goes out that the bucket did not
            // count. (Not waiting for them, a Redis that reads but cannot write let every intent
            // through with the rate limit silently off.)
            if !writes.isEmpty {
                let replies = try await policy.client.submit(writes).get()
                guard replies.count == written.count else {
                    throw .protocolError("\(replies.count) replies to \(written.count) bucket writes")
                }
                for (reply, index) in zip(replies, written) {
                    if case .error(let message) = reply { answers[index] = .failure(.server(message)) }
                }
            }
            return answers
        }
    }

    /// Shadow mode's stand-in for the mailbox it never writes (`shadow-waiting` in RedisKeys):
    /// enforce mode parks a device's first intent that must wait, holds the device's later
    /// intents behind it until its due time, and spends a token when it takes it then. Shadow
    /// mode notes that due time, so that until then the device's later intents are decided
    /// `park` as enforce mode's are, and spends the token the take would spend, so that the
    /// bucket after the due time is enforce mode's. What is left apart: a
    /// take comes a mailbox poll after the due time in enforce mode, and its claim holds the
    /// device's intents until the send is answered, where the note ends at the due time; a
    /// redelivery of the intent enforce mode parked is answered by its mailbox there (no
    /// decision), decided again here.
    enum ShadowMailbox {
        /// A noted mailbox as the admission sees it: the `waiting` string of a mailbox holding
        /// an id no intent has (invalid UTF-8), so that it holds every intent back and is never
        /// "this intent".
        static let note: [UInt8] = Array("0:".utf8) + [0xFF]

        /// Until when to note the device's mailbox after a group's decisions: when an intent
        /// would park (expiration 0 intents cannot) and the device had nothing noted, its due
        /// time, which enforce mode caps at the newest parking intent's expiration (plus a
        /// second) as Scripts/park.lua does, its token reserved unless that intent will have
        /// expired by then (a take then spends none). Nil: nothing to note.
        static func noting(_ group: Group, _ decisions: [Admission], held: [UInt8]?, backoffUntil: Int64,
                           bucket: inout Bucket) -> Int64? {
            guard DevicePolicy.mailbox(held, holdsFor: "") == .nothing,
                  let parking = decisions.indices.last(where: { decisions[$0] == .wait && !group.nowOrNever[$0] }) else { return nil }
            let due = max(backoffUntil, bucket.due), expiresAt = group.expirations[parking] * 1000
            if expiresAt >= due { bucket.reserve(at: due) }
            return min(due, expiresAt + 1000)
        }
    }

    /// A device's token bucket as a GCRA theoretical arrival time (see the key list above).
    struct Bucket {
        let burst: Int64
        let interval: Int64
        let now: Int64
        /// The arrival time: `now` or later.
        private(set) var arrival: Int64
        /// The new arrival time once a token was spent.
        private(set) var spent: Int64?

        init(_ limit: RelayConfiguration.Policy.RateLimit, stored: Int64?, now: Int64) {
            burst = limit.isEnabled ? Int64(limit.burst) : 0
            interval = limit.intervalMilliseconds
            self.now = now
            arrival = max(stored ?? now, now)
        }

        /// Takes a token if there is one (always, with the limit off).
        mutating func spend() -> Bool {
            guard burst > 0 else { return true }
            guard arrival - now <= (burst - 1) * interval else { return false }
            arrival += interval
            spent = arrival
            return true
        }

        /// When the next token is there.
        var due: Int64 { burst > 0 ? max(now, arrival - (burst - 1) * interval) : now }

        /// Spends the token a mailbox take at `due` (when the bucket has one) will spend: as
        /// Scripts/take.lua does, from `due` at the earliest.
        mutating func reserve(at due: Int64) {
            guard burst > 0 else { return }
            arrival = max(arrival, due) + interval
            spent = arrival
        }

        /// `<until ms> <level>` as stored.
        static func backoff(_ stored: String?) -> (until: Int64, level: Int64)? {
            guard let parts = stored?.split(separator: " "), parts.count == 2,
                  let until = Int64(parts[0]), let level = Int64(parts[1]) else { return nil }
            return (until, level)
        }
    }
}
