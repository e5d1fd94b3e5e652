import Redis

/// What the relay needs from Redis: once a parked intent's offset is committed, the mailbox in
/// Redis is its only copy. So Redis must never evict keys (`maxmemory-policy noeviction`; every
/// relay key has a TTL, so even the `volatile-*` policies can drop parked intents), and should
/// persist writes (`appendonly yes`) so that a restart keeps them. Read with `INFO` (managed
/// services often refuse `CONFIG GET`).
struct RedisGuarantees: Sendable, Equatable {
    /// `maxmemory_policy` as Redis reports it.
    var evictionPolicy: String
    /// `aof_enabled`.
    var appendOnly: Bool

    static func read(_ client: RedisClient) async throws(RedisError) -> RedisGuarantees {
        // Both sections in one round trip.
        let replies = try await client.pipeline([RedisCommand("INFO", ["memory"]), RedisCommand("INFO", ["persistence"])])
        for case .error(let message) in replies { throw .server(message) }
        guard let memory = replies[0].string, let persisted = replies[1].string,
              let guarantees = parse(info: memory + "\n" + persisted) else {
            throw .protocolError("INFO answered without maxmemory_policy or aof_enabled")
        }
        return guarantees
    }

    /// From `INFO` text (`field:value` lines).
    static func parse(info: String) -> RedisGuarantees? {
        var fields: [Substring: Substring] = [:]
        for line in info.split(whereSeparator: \.isNewline) {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields[line[..<colon]] = line[line.index(after: colon)...]
        }
        guard let policy = fields["maxmemory_policy"], let aof = fields["aof_enabled"] else { return nil }
        return RedisGuarantees(evictionPolicy: String(policy), appendOnly: aof == "1")
    }

    /// Why this Redis may lose parked intents to eviction; nil with `noeviction`.
    var evictionRisk: String? {
        guard evictionPolicy != "noeviction" else { return nil }
        return "Redis' maxmemory-policy is \(evictionPolicy): under memory pressure it deletes keys, parked intents "
            + "(whose offsets are committed) among them. Set maxmemory-policy noeviction, or redis.allow_eviction: true "
            + "to accept losing them"
    }

    /// Why a Redis restart may lose parked intents; nil with `appendonly yes`.
    var persistenceRisk: String? {
        appendOnly ? nil : "Redis' appendonly is off: a Redis restart loses the intents parked since its last snapshot"
    }
}
