/// The rules applied in Redis per device, and per broadcast channel (see docs/redis.md);
/// without Redis none apply. The relay's configuration names it `RelayConfiguration.Policy`;
/// it lives here, with the decisions it drives (`DeviceAdmission`), free of Redis.
public struct PolicyConfiguration: Sendable {
    /// A token bucket per device token: `burst` sends at once, then `refillPerSecond`.
    public struct RateLimit: Sendable, Equatable {
        /// 0 turns the limit off.
        public var burst: Int
        public var refillPerSecond: Double

        public init(burst: Int = 10, refillPerSecond: Double = 0.2) {
            self.burst = burst
            self.refillPerSecond = refillPerSecond
        }

        public var isEnabled: Bool { burst > 0 }

        /// Milliseconds per token, rounded up to a whole millisecond (the bucket is kept in
        /// whole milliseconds, so refills above 1000 per second count as 1000).
        public var intervalMilliseconds: Int64 { max(1, Int64((1000 / refillPerSecond).rounded(.up))) }
    }

    /// The rules for one topic: the global ones with that topic's overrides applied.
    public struct Rules: Sendable, Equatable {
        /// An intent whose (topic, id) APNs already answered within this window is not sent
        /// again; its outcome is `duplicate`.
        public var dedupeWindowSeconds: Int64 = 86_400
        public var rateLimit = RateLimit()
        /// Intents of one consumed batch with the same (token, topic, collapse id) collapse
        /// to the newest; the others come out `coalesced`.
        public var coalesce = true
        /// The device's unseen Live Activity budgets the relay paces (with Redis).
        public var liveActivity = LiveActivityBudgets()
        /// `enforce`, or `shadow`: every decision is taken and counted as in enforce mode,
        /// and the intent goes out as with the policy off (docs/redis.md, "Shadow mode").
        public var mode = Mode.enforce

        public init() {}
    }

    public enum Mode: String, Sendable, Equatable {
        case enforce, shadow
    }

    /// Budgets a device keeps for Live Activity pushes and APNs never reports (it answers
    /// 200 and the device drops what is over): paced per token in Redis, each over a sliding
    /// window (plus a second for the push's way to the device). 0 turns one off.
    public struct LiveActivityBudgets: Sendable, Equatable {
        /// Priority-10 updates per activity token per hour; past it an update goes out at
        /// priority 5 (outcome `priority_downgraded: true`). `end` events count, and are
        /// never downgraded.
        public var priority10PerHour = 12
        /// Push-to-starts per push-to-start token per ``startWindowSeconds``; past it a start
        /// waits in the device's mailbox until the window allows (or its expiration).
        public var startsPerWindow = 8
        public var startWindowSeconds: Int64 = 3600

        public init() {}
    }

    /// What applies to broadcast channels (with Redis): one token bucket per channel, since
    /// an update reaches every subscriber at once. Off by default (`burst` 0): a channel's
    /// sender knows its cadence, and a limit makes updates wait. Past it, the newest update
    /// waits in the channel's mailbox (a channel with storage policy 1) and the older ones
    /// are `coalesced` by it; a No-Message-Stored channel's update (expiration 0) cannot
    /// wait: it comes out `expired` (a batch's updates take the tokens in order).
    public struct Channels: Sendable, Equatable {
        public var rateLimit = RateLimit(burst: 0, refillPerSecond: 0.1)

        public init() {}
    }

    /// The global rules.
    public var defaults = Rules()
    public var channels = Channels()
    /// Per-topic rules (complete: overrides merged with the global rules when loaded).
    public var topics: [String: Rules] = [:]
    /// How often the owner of a partition looks for mailboxes that became due.
    public var mailboxPollMilliseconds = 1000
    /// How long a mailbox entry being sent stays claimed: if the relay sending it dies (or
    /// Redis loses the claim's release in a failover), the partition's owner takes it
    /// again after this.
    public var mailboxClaimLeaseSeconds = 120
    /// A device APNs answers 429 TooManyRequests waits this long, doubling while 429s
    /// repeat, up to the maximum.
    public var backoffInitialSeconds: Int64 = 60
    public var backoffMaxSeconds: Int64 = 3600
    /// Answer intents for a (token, topic) APNs answered 410 for `unregistered`
    /// (`KnownUnregistered`) without asking APNs again, unless the intent's
    /// `token_registered_at` is newer than the 410's timestamp. Needs Redis.
    public var skipKnownUnregistered = false
    /// How long a 410 is remembered for that (from the 410; a delivery forgets it at once).
    public var knownUnregisteredTTLSeconds: Int64 = 2_592_000

    public init() {}

    public var dedupeWindowSeconds: Int64 {
        get { defaults.dedupeWindowSeconds }
        set { defaults.dedupeWindowSeconds = newValue }
    }

    /// The rules that apply to `topic`.
    public func rules(for topic: String) -> Rules {
        topics.isEmpty ? defaults : topics[topic] ?? defaults
    }

    /// The rules for `recipient` (``Intent/recipient``) under `topic`: the topic's, or for a
    /// broadcast channel (`channel:<id>`) the topic's dedupe window and mode with the
    /// channels' own token bucket, and nothing else of a device's (no collapsing by collapse
    /// id, no 429 backoff).
    public func rules(for topic: String, recipient: String) -> Rules {
        let topicRules = rules(for: topic)
        guard recipient.hasPrefix(Intent.channelRecipientPrefix) else { return topicRules }
        var rules = Rules()
        rules.dedupeWindowSeconds = topicRules.dedupeWindowSeconds
        rules.mode = topicRules.mode
        rules.rateLimit = channels.rateLimit
        rules.coalesce = false
        return rules
    }

    /// The longest dedupe window of any topic (records that serve every topic keep this long).
    public var longestDedupeWindowSeconds: Int64 {
        topics.values.reduce(defaults.dedupeWindowSeconds) { max($0, $1.dedupeWindowSeconds) }
    }
}
