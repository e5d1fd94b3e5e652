/// A batch's admission decisions for one device (or channel) and topic, from what Redis
/// holds for it: pure, no I/O and no clock (`now` is passed in). The relay's `DevicePolicy`
/// reads Redis, asks ``decide(_:waiting:backoffUntil:bucket:now:unregisteredAt:record:)`` and
/// writes back what the bucket spent.
package enum DeviceAdmission {
    /// What a device and app's mailbox holds, as an intent being admitted sees it.
    package enum MailboxHolds: Equatable {
        case nothing
        /// The intent itself, parked or being sent (it is a redelivery).
        case thisIntent
        /// An older intent, parked or being sent: the one being admitted must not overtake it.
        case anotherIntent
    }

    /// What the ids of a `waiting` value say about the intent `id`. A value that does not read
    /// so (Redis holds whatever was written there) names no id.
    package static func mailbox(_ value: [UInt8]?, holdsFor id: String) -> MailboxHolds {
        guard let value, let colon = value.firstIndex(of: UInt8(ascii: ":")),
              let length = Int(String(decoding: value[..<colon], as: UTF8.self)),
              length >= 0, length <= value.count - colon - 1 else { return .nothing }
        let pid = value[(colon + 1)..<(colon + 1 + length)], cid = value[(colon + 1 + length)...]
        if (!pid.isEmpty && pid.elementsEqual(id.utf8)) || (!cid.isEmpty && cid.elementsEqual(id.utf8)) { return .thisIntent }
        return pid.isEmpty && cid.isEmpty ? .nothing : .anotherIntent
    }

    package enum Admission: Sendable, Equatable {
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
    package struct Group: Sendable {
        package let token: String
        package let topic: String
        package let rules: PolicyConfiguration.Rules
        /// One intent of the group: its id, whether it is now-or-never (expiration 0: it cannot
        /// wait), its `token_registered_at`, its expiration (epoch s) and the position of the
        /// newest intent of its collapse id when that is another one (nil for the newest and for
        /// intents that do not collapse). One array of these, not one per field: most groups
        /// are one intent, and each array was an allocation of its own.
        package struct Entry: Sendable, Equatable {
            package let id: String
            package let nowOrNever: Bool
            package let registeredAt: Int64?
            package let expiration: Int64
            package var collapsesInto: Int?
        }

        /// The intents in batch order.
        package private(set) var entries: [Entry] = []
        /// The pair's remembered 410 is read (every group of a device's token, not of a channel):
        /// without the option a delivery deletes it only where the read found it (``Decided``).
        package var readsUnregistered = false
        /// The remembered 410 decides (`policy.skip_known_unregistered`): an intent it applies to
        /// is `knownUnregistered`.
        package var skipsKnownUnregistered = false

        /// The intents' ids, in batch order.
        package var ids: [String] { entries.map(\.id) }
        /// For each intent, its `token_registered_at`.
        package var registeredAt: [Int64?] { entries.map(\.registeredAt) }
        /// For each intent, the position of the newest intent of its collapse id when that is
        /// another one.
        package var collapsesInto: [Int?] {
            get { entries.map(\.collapsesInto) }
            set { for (position, into) in newValue.enumerated() { entries[position].collapsesInto = into } }
        }

        /// Marks the intent at `position` as collapsing into the one at `newer`.
        package mutating func collapse(_ position: Int, into newer: Int) {
            entries[position].collapsesInto = newer
        }

        package init(token: String, topic: String, rules: PolicyConfiguration.Rules) {
            self.token = token
            self.topic = topic
            self.rules = rules
        }

        /// Adds the next intent; answers its position.
        package mutating func append(_ id: String, nowOrNever: Bool, registeredAt: Int64? = nil, expiration: Int64 = Intent.latestExpiration) -> Int {
            entries.append(Entry(id: id, nowOrNever: nowOrNever, registeredAt: registeredAt, expiration: expiration))
            return entries.count - 1
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
    package static func decide(_ group: Group, waiting: [UInt8]?, backoffUntil: Int64, bucket: inout Bucket, now: Int64,
                               unregisteredAt: Int64? = nil, record: (Int) -> AnswerRecord??) -> [Admission] {
        let entries = group.entries
        var decisions = Array(repeating: Admission.wait, count: entries.count)
        // The older intents of each collapse id, newest first, by the position of the newest.
        var older: [Int: [Int]] = [:]
        for (position, entry) in entries.enumerated() {
            if let into = entry.collapsesInto { older[into, default: []].insert(position, at: 0) }
        }
        /// Decides one intent; true when it survives its collapse id (it can still be delivered).
        func decideOne(_ position: Int) -> Bool {
            let holds = mailbox(waiting, holdsFor: entries[position].id)
            let decision: Admission
            if let record = record(position) {
                decision = .duplicate(record)
            } else if holds == .thisIntent {
                decision = .inMailbox
            } else if let unregisteredAt, (entries[position].registeredAt ?? .min) <= unregisteredAt {
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
            case .wait: !entries[position].nowOrNever
            case .coalesced, .knownUnregistered: false
            }
        }
        /// The newest intent decided so far that goes out now.
        var lastSent: Int?
        for position in entries.indices where entries[position].collapsesInto == nil {
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

    /// One group's answer: its intents' decisions, when the device may be sent to next, and
    /// whether a delivery of its intents deletes the pair's remembered 410: where Redis held one
    /// when read, where it was not read, and always with `policy.skip_known_unregistered` (then
    /// this relay itself may remember one after the read, for an earlier intent of the pair
    /// still at APNs). Without the option this relay remembers none, so a read that found none
    /// leaves nothing for the delivery to delete.
    package struct Decided: Sendable {
        package var decisions: [Admission]
        package var due: Int64
        package var forgetsUnregistered = true

        package init(decisions: [Admission], due: Int64, forgetsUnregistered: Bool = true) {
            self.decisions = decisions
            self.due = due
            self.forgetsUnregistered = forgetsUnregistered
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
    package enum ShadowMailbox {
        /// A noted mailbox as the admission sees it: the `waiting` string of a mailbox holding
        /// an id no intent has (invalid UTF-8), so that it holds every intent back and is never
        /// "this intent".
        package static let note: [UInt8] = Array("0:".utf8) + [0xFF]

        /// Until when to note the device's mailbox after a group's decisions: when an intent
        /// would park (expiration 0 intents cannot) and the device had nothing noted, its due
        /// time, which enforce mode caps at the newest parking intent's expiration (plus a
        /// second) as Scripts/park.lua does, its token reserved unless that intent will have
        /// expired by then (a take then spends none). Nil: nothing to note.
        package static func noting(_ group: Group, _ decisions: [Admission], held: [UInt8]?, backoffUntil: Int64,
                           bucket: inout Bucket) -> Int64? {
            guard mailbox(held, holdsFor: "") == .nothing,
                  let parking = decisions.indices.last(where: { decisions[$0] == .wait && !group.entries[$0].nowOrNever }) else { return nil }
            let due = max(backoffUntil, bucket.due), expiresAt = group.entries[parking].expiration * 1000
            if expiresAt >= due { bucket.reserve(at: due) }
            return min(due, expiresAt + 1000)
        }
    }

    /// A device's token bucket as a GCRA theoretical arrival time (``RedisKeys``, `rate`).
    package struct Bucket: Sendable {
        package let burst: Int64
        package let interval: Int64
        package let now: Int64
        /// The arrival time: `now` or later.
        package private(set) var arrival: Int64
        /// The new arrival time once a token was spent.
        package private(set) var spent: Int64?

        package init(_ limit: PolicyConfiguration.RateLimit, stored: Int64?, now: Int64) {
            burst = limit.isEnabled ? Int64(limit.burst) : 0
            interval = limit.intervalMilliseconds
            self.now = now
            arrival = max(stored ?? now, now)
        }

        /// Takes a token if there is one (always, with the limit off).
        package mutating func spend() -> Bool {
            guard burst > 0 else { return true }
            guard arrival - now <= (burst - 1) * interval else { return false }
            arrival += interval
            spent = arrival
            return true
        }

        /// When the next token is there.
        package var due: Int64 { burst > 0 ? max(now, arrival - (burst - 1) * interval) : now }

        /// Spends the token a mailbox take at `due` (when the bucket has one) will spend: as
        /// Scripts/take.lua does, from `due` at the earliest.
        package mutating func reserve(at due: Int64) {
            guard burst > 0 else { return }
            arrival = max(arrival, due) + interval
            spent = arrival
        }

        /// `<until ms> <level>` as stored.
        package static func backoff(_ stored: String?) -> (until: Int64, level: Int64)? {
            guard let parts = stored?.split(separator: " "), parts.count == 2,
                  let until = Int64(parts[0]), let level = Int64(parts[1]) else { return nil }
            return (until, level)
        }
    }
}
