import Foundation

/// Which outcomes `apns-relay redrive` re-drives: the filter.
public struct RedriveFilter: Sendable {
    /// Outcome statuses to re-drive: `failed` by default; `expired` and `invalid` may be asked
    /// for (no dedupe record holds them), though an `expired` intent is past its expiration
    /// (or was now-or-never), so it is skipped and only counted.
    public var statuses: Set<String> = ["failed"]
    /// Only outcomes whose `reason` starts so (`RetryDeadline`, `CredentialFault`...).
    public var reasonPrefix: String?
    /// Only these apps (`topic`); empty: every one.
    public var topics: Set<String> = []
    /// Only these lanes (intents topics); empty: every one.
    public var lanes: Set<String> = []
    /// Outcomes decided from then on (`at`, ms since the epoch)...
    public var since: Int64
    /// ...up to then (nil: up to now).
    public var until: Int64?

    public init(since: Int64) {
        self.since = since
    }

    func matches(_ outcome: RedriveSelection.Outcome) -> Bool {
        statuses.contains(outcome.status) && outcome.at >= since && until.map { outcome.at <= $0 } != false
            && reasonPrefix.map { outcome.reason?.hasPrefix($0) == true } != false
            && (topics.isEmpty || topics.contains(outcome.topic)) && (lanes.isEmpty || lanes.contains(outcome.lane))
    }
}

/// What a redrive run decides from the outcomes topic alone: the intents to fetch (the newest
/// matching outcome of each (recipient, topic, id), the relay's dedupe key), and those skipped
/// because a later outcome answered them, or a newer intent with their `collapse_id` has an
/// outcome. Fed the outcomes in the order read; pure, so that its rules are tested
/// without Kafka. (Which of the fetched ones a newer re-driven one supersedes, ``Redrive``
/// decides once it knows which are re-driven.)
public struct RedriveSelection: Sendable {
    /// The fields of an outcome a redrive reads.
    public struct Outcome: Sendable, Equatable {
        public var id: String
        /// The device token, or `channel:<id>` for a channel intent.
        public var recipient: String
        public var topic: String
        public var status: String
        public var reason: String?
        public var collapseID: String?
        public var lane: String
        public var partition: Int32
        public var offset: Int64
        public var at: Int64
        /// When the intent was consumed (`at` less `latency_ms`; `at` without it). For a
        /// re-driven copy, the earliest time (its original's is not known): no other intent is
        /// older than it by this measure.
        public var consumedAt: Int64
        /// Where the intent first was: its own lane, partition and offset, or for a re-driven
        /// copy its original's (the outcome's `redrive`), for telling which of two is newer.
        public var origin: Place { originalPlace ?? Place(lane: lane, partition: partition, offset: offset) }
        var originalPlace: Place?

        public struct Place: Sendable, Equatable {
            public var lane: String
            public var partition: Int32
            public var offset: Int64
        }

        /// Nil for what is no outcome of an intent a redrive could fetch (an invalid message
        /// without an id, a record that is not an outcome).
        public init?(json: [UInt8]) {
            guard let object = try? JSONSerialization.jsonObject(with: Data(json)) as? [String: Any],
                  let id = object["id"] as? String, let topic = object["topic"] as? String, let status = object["status"] as? String,
                  let partition = object["partition"] as? Int, let offset = object["offset"] as? Int, let at = object["at"] as? Int,
                  let lane = object["lane"] as? String else { return nil }
            if let token = object["token"] as? String {
                recipient = token
            } else if let channel = object["channel_id"] as? String {
                recipient = "channel:" + channel
            } else {
                return nil
            }
            self.id = id
            self.topic = topic
            self.status = status
            reason = object["reason"] as? String
            collapseID = object["collapse_id"] as? String
            self.lane = lane
            self.partition = Int32(clamping: partition)
            self.offset = Int64(offset)
            self.at = Int64(at)
            // Saturated: a record no relay wrote may hold times that would overflow.
            let (consumed, overflowed) = self.at.subtractingReportingOverflow(Int64((object["latency_ms"] as? Int).map { max(0, $0) } ?? 0))
            consumedAt = overflowed ? .min : consumed
            if let redrive = object["redrive"] as? [String: Any], let lane = redrive["lane"] as? String,
               let partition = redrive["partition"] as? Int, let offset = redrive["offset"] as? Int {
                originalPlace = Place(lane: lane, partition: Int32(clamping: partition), offset: Int64(offset))
                consumedAt = .min
            }
        }

        public init(id: String, recipient: String, topic: String, status: String, reason: String? = nil, collapseID: String? = nil,
                    lane: String, partition: Int32, offset: Int64, at: Int64, consumedAt: Int64? = nil) {
            self.consumedAt = consumedAt ?? at
            self.id = id
            self.recipient = recipient
            self.topic = topic
            self.status = status
            self.reason = reason
            self.collapseID = collapseID
            self.lane = lane
            self.partition = partition
            self.offset = offset
            self.at = at
        }
    }

    /// Why an intent the filter matched is not re-driven.
    public enum Skip: String, Sendable, CaseIterable {
        /// A later outcome answered it (`delivered`, `duplicate`...), or its dedupe record says so.
        case answered
        /// A newer intent of its recipient with the same `collapse_id` has an outcome, whatever
        /// it says, or is re-driven too; or (with Redis) its recipient's mailbox holds a newer
        /// intent: it would replace a newer notification.
        case superseded
        /// Its expiration passed (or it was now-or-never).
        case expired
        /// The intents topic no longer holds it (retention).
        case gone
        /// It no longer reads as an intent (the relay's rules changed since).
        case invalid
        /// A redrive produced it already (the mark in Redis).
        case redriven
    }

    public let filter: RedriveFilter
    /// Per (recipient, topic, id), the newest outcome the filter matched.
    private var matched: [String: Outcome] = [:]
    /// Per (recipient, topic, id), when its newest outcome the filter does not select was decided.
    private var answeredAt: [String: Int64] = [:]
    /// Per (recipient, topic, collapse id), the newest intents answered (whatever their answer).
    private var later: [String: Later] = [:]

    /// The newest intents of one (recipient, topic, collapse id): per lane partition the one
    /// furthest on and the one consumed last. Enough to tell whether any other intent came
    /// after a given one (``hasNewer(than:)``), in memory bounded by the partitions.
    struct Later {
        var furthest: [String: (offset: Int64, id: String)] = [:]
        var latest: [String: (consumedAt: Int64, id: String)] = [:]

        static func place(_ outcome: Outcome) -> String { "\(outcome.origin.lane) \(outcome.origin.partition)" }

        mutating func add(_ outcome: Outcome) {
            let place = Self.place(outcome)
            if (furthest[place]?.offset ?? .min) < outcome.origin.offset { furthest[place] = (outcome.origin.offset, outcome.id) }
            if (latest[place]?.consumedAt ?? .min) < outcome.consumedAt { latest[place] = (outcome.consumedAt, outcome.id) }
        }

        /// Whether another intent came after `outcome`'s: later in the same lane's partition
        /// (by offset: intents consumed together have no order in time), or consumed later on
        /// another.
        func hasNewer(than outcome: Outcome) -> Bool {
            let place = Self.place(outcome)
            if let newest = furthest[place], newest.id != outcome.id, newest.offset > outcome.origin.offset { return true }
            return latest.contains { $0.key != place && $0.value.id != outcome.id && $0.value.consumedAt > outcome.consumedAt }
        }
    }

    public private(set) var outcomesRead = 0

    public init(filter: RedriveFilter) {
        self.filter = filter
    }

    private static func key(_ outcome: Outcome) -> String { outcome.recipient + " " + outcome.topic + " " + outcome.id }
    static func collapseKey(_ outcome: Outcome, _ collapseID: String) -> String {
        outcome.recipient + " " + outcome.topic + " " + collapseID
    }

    /// Reads one outcome.
    public mutating func add(_ outcome: Outcome) {
        outcomesRead += 1
        let key = Self.key(outcome)
        if filter.matches(outcome) {
            if (matched[key]?.at ?? .min) <= outcome.at { matched[key] = outcome }
        } else if outcome.status != "failed" && outcome.status != "expired" {
            // An answer (a failure again is none: the intent is still to be sent).
            answeredAt[key] = max(answeredAt[key] ?? .min, outcome.at)
        }
        if let collapseID = outcome.collapseID { later[Self.collapseKey(outcome, collapseID), default: Later()].add(outcome) }
    }

    /// The outcomes to fetch, oldest first, and the ones skipped with why.
    public func decide() -> (redrive: [Outcome], skipped: [(Outcome, Skip)]) {
        var redrive: [Outcome] = [], skipped: [(Outcome, Skip)] = []
        for outcome in matched.values.sorted(by: Self.older) {
            if let answered = answeredAt[Self.key(outcome)], answered > outcome.at {
                skipped.append((outcome, .answered))
            } else if let collapseID = outcome.collapseID, later[Self.collapseKey(outcome, collapseID)]?.hasNewer(than: outcome) == true {
                skipped.append((outcome, .superseded))
            } else {
                redrive.append(outcome)
            }
        }
        return (redrive, skipped)
    }

    /// Older first: by when the outcome was decided, then where the intent was.
    static func older(_ one: Outcome, _ other: Outcome) -> Bool {
        (one.at, one.lane, one.partition, one.offset) < (other.at, other.lane, other.partition, other.offset)
    }
}
