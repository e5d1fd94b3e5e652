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

    /// What every node guarantees (every master of a cluster): the first eviction policy that
    /// is not `noeviction`, and append-only only when all have it.
    static func read(_ client: RedisClient) async throws(RedisError) -> RedisGuarantees {
        // Both sections in one round trip per node.
        let answers = try await client.onEveryNode([RedisCommand("INFO", ["memory"]), RedisCommand("INFO", ["persistence"])])
        var combined: RedisGuarantees?
        for (node, replies) in answers {
            for case .error(let message) in replies { throw .server(message) }
            guard replies.count == 2, let memory = replies[0].string, let persisted = replies[1].string,
                  var guarantees = parse(info: memory + "\n" + persisted) else {
                throw .protocolError("INFO answered without maxmemory_policy or aof_enabled (\(node))")
            }
            if answers.count > 1, guarantees.evictionPolicy != "noeviction" {
                guarantees.evictionPolicy += " (at \(node))"
            }
            if let earlier = combined {
                guarantees.evictionPolicy = earlier.evictionPolicy == "noeviction" ? guarantees.evictionPolicy : earlier.evictionPolicy
                guarantees.appendOnly = guarantees.appendOnly && earlier.appendOnly
            }
            combined = guarantees
        }
        guard let combined else { throw .unavailable("no Redis node answered INFO") }
        return combined
    }

    /// From `INFO` text (`field:value` lines).
    static func parse(info: String) -> RedisGuarantees? {
        let fields = RedisInfo.fields(info)
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
