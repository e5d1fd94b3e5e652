import Redis

/// The Live Activity budgets a device keeps and APNs never reports
/// (``RelayConfiguration/Policy/LiveActivityBudgets``), paced per token in Redis for the whole
/// fleet: a sorted set per (token, topic, budget) of the intents that spent it, by when
/// (`<prefix>budget:{<token>}:<topic>:<kind>`, Scripts/budget.lua), over a sliding window.
/// The key shares the device's hash tag, so it lives beside the device's other keys.
struct LiveActivityPacer: Sendable {
    /// KEYS: the budget's set. ARGV: now ms, limit, window ms, intent id. Answers {1, 0} (may
    /// go; spent, or spent already by this intent) or {0, ms until the window allows}.
    static let script = RedisScript(RedisScripts.source(PackageResources.budget_lua))
    /// Added to every window: a push takes its time to reach the device, whose own window
    /// starts there; without it two pushes a window apart as the relay saw them could land
    /// closer together.
    static let slackMilliseconds: Int64 = 1000

    enum Budget: String, Sendable, CaseIterable {
        /// Priority-10 updates (and ends) of one activity token, per hour.
        case priority10 = "p10"
        /// Push-to-starts of one push-to-start token, per `start_window_seconds`.
        case start

        /// The name metrics give it (`budget` label).
        var name: String { self == .priority10 ? "priority10" : "start" }
    }

    let client: RedisClient
    let keys: RedisKeys

    /// Spends one of `limit` per `windowSeconds` for `intentID` at `now` (epoch ms): nil when it
    /// may go now, else how long it has to wait (ms).
    func spend(_ budget: Budget, token: String, topic: String, intentID: String, limit: Int, windowSeconds: Int64,
               now: Int64) async throws(RedisError) -> Int64? {
        let key = keys.budget(token: token, topic: topic, kind: budget.rawValue)
        let reply = try await client.evaluate(Self.script, keys: [key],
                                              arguments: [now, limit, windowSeconds * 1000 + Self.slackMilliseconds, intentID])
        guard let values = reply.array, values.count == 2, let allowed = values[0].integer, let wait = values[1].integer else {
            throw .protocolError("budget script answered \(reply)")
        }
        return allowed == 1 ? nil : max(wait, 1)
    }

    /// Moves `intentID`'s spend to `now` (epoch ms), when APNs accepted its push: the device
    /// counts a push from when it took it, which is up to the send's whole time after the spend
    /// was scored. Scored by acceptance, a spend the window left as the relay sees it has left
    /// it on the device too, however long the send took (the slack then only has to cover the
    /// clocks). Only ever later (`GT`); a spend the window (or the key's expiry) removed while
    /// the send took its time is added again, as the device counts it from now. The key lives a
    /// window from now.
    func accepted(_ budget: Budget, token: String, topic: String, intentID: String, windowSeconds: Int64,
                  now: Int64) async throws(RedisError) {
        let key = keys.budget(token: token, topic: topic, kind: budget.rawValue)
        let replies = try await client.pipeline([
            RedisCommand("ZADD", [key, "GT", "\(now)", intentID]),
            RedisCommand("PEXPIRE", [key, "\(windowSeconds * 1000 + Self.slackMilliseconds)"]),
        ])
        for case .error(let message) in replies { throw .server(message) }
    }
}
