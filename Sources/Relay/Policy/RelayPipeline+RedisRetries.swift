import Common
import Redis

extension RelayPipeline {
    /// How often Redis' eviction policy and persistence are checked again while running.
    static let guaranteesCheckInterval = Duration.seconds(60)

    /// Checks what Redis guarantees for parked intents (``RedisGuarantees``). False when the
    /// relay must not go on: Redis can evict keys and `redis.allow_eviction` is off; then the
    /// relay is stopped (``refusal`` says why). Redis not answering is not a refusal: the check
    /// comes again.
    func redisGuaranteesHold() async -> Bool {
        guard let redis, policy != nil else { return true }
        let guarantees: RedisGuarantees
        do {
            guarantees = try await RedisGuarantees.read(redis)
        } catch {
            logger.warning("cannot read Redis' eviction policy yet", metadata: ["redis.error": "\(error)"])
            return true
        }
        // Warnings at the first check and when they change, not every minute.
        let allowed = guarantees.evictionRisk.map { "\($0) (allowed by redis.allow_eviction)" }
        let warnings = [guarantees.persistenceRisk, configuration.redis.allowEviction ? allowed : nil].compactMap { $0 }
        health.redisRisks(warnings)
        guard let risk = guarantees.evictionRisk, !configuration.redis.allowEviction else { return true }
        health.refuse(risk)
        requestStop()
        return false
    }

    /// Checks Redis' guarantees again every ``guaranteesCheckInterval`` (a failover or a
    /// restart may bring a differently configured Redis) until the relay stops.
    func watchRedisGuarantees() async {
        guard redis != nil, policy != nil else { return }
        while await !stopping.wait(atMost: Self.guaranteesCheckInterval), !Task.isCancelled {
            guard await redisGuaranteesHold() else { return }
        }
    }

    static let refusalsBeforeGivingUp = 3

    /// Runs `body` until it succeeds. While Redis fails: retries with backoff as long as the
    /// item's partition is still ours, or with `redis.fail_open` gives up at once. A command
    /// Redis refuses (``RedisError/isRefusal``) is asked again only twice. Nil when it gave up.
    func withRedisRetries<T>(_ item: WorkItem, _ body: () async throws(RedisError) -> T) async -> T? {
        var failures = 0, refusals = 0
        return await Retry(backoff: backoff).run { () async throws(RedisError) -> T in
            let started = ContinuousClock.now
            let result = try await body()
            RelayMetrics.redisLatency.recordNanoseconds((ContinuousClock.now - started).totalNanoseconds)
            if failures > 0 { health.redisRecovered() }
            return result
        } failed: { error, count in
            failures = count
            if error.isRefusal {
                // Not an outage: Redis refuses this item's command for what its keys hold.
                // It goes on as with `redis.fail_open`, alone.
                refusals += 1
                if refusals == Self.refusalsBeforeGivingUp {
                    RelayMetrics.redisRefused.increment()
                    logger.error("Redis refuses this intent's command: it goes on without the policy",
                                 metadata: metadata(item, ["redis.error": "\(error)"]))
                    return .giveUp
                }
            } else {
                health.redisFailed(error)
            }
            return configuration.redis.failOpen || !isCurrent(item) ? .giveUp : .retry
        }
    }
}
