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
}
