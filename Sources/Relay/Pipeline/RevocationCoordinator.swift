import Common
import Dispatch
import Kafka
import Logging

/// The consumer's poll thread waiting in a revocation for the revoking partitions' work at APNs,
/// and the one owner of that wait: which shards still have such work (``RevocationWait``, under a
/// lock of its own, taken in a shard's step on its loop where a shard's mark changes), how long
/// the poll thread waits, and the revocation commits the metric has counted.
///
/// Lock order: taken last (where a shard's items end, inside the relay-wide lock); while it is
/// held no other lock is taken.
final class RevocationCoordinator: Sendable {
    static let waitLimitSeconds = 60
    /// How long a revocation goes on waiting past its usual bound while Redis fails: well inside
    /// librdkafka's `max.poll.interval.ms` (300 s by default), past which the group would take
    /// the partitions away without a commit.
    static let redisWaitLimitSeconds = 180

    /// ``redisWaitLimitSeconds``, or less with a `max.poll.interval.ms` configured below 190 s:
    /// 10 s inside it (the revocation's commit retries come on top).
    static func redisWaitLimit(_ consumerSettings: [String: String]) -> Int {
        let pollInterval = consumerSettings["max.poll.interval.ms"].flatMap { Int($0) }.map { $0 / 1000 } ?? 300
        return min(redisWaitLimitSeconds, max(pollInterval - 10, 0))
    }

    private let waiting = Locked(RevocationWait<DispatchSemaphore>())
    /// The consumer's count of failed revocation commits the metric has seen.
    private let commitFailuresCounted = Locked(0)
    /// The usual bound: the shutdown deadline, ``waitLimitSeconds`` at most.
    private let bound: Duration
    /// The bound in all while Redis fails (``redisWaitLimit(_:)``).
    private let redisLimit: Duration
    /// The longest retry backoff: a record retrying lands within a step or two of it.
    private let backoffMaximum: Duration
    private let logger: Logger

    init(shutdownDeadlineSeconds: Int, consumerSettings: [String: String], backoffMaximum: Duration, logger: Logger) {
        self.bound = .seconds(min(shutdownDeadlineSeconds, Self.waitLimitSeconds))
        self.redisLimit = .seconds(Self.redisWaitLimit(consumerSettings))
        self.backoffMaximum = backoffMaximum
        self.logger = logger
    }

    /// A revocation begins: nothing of an earlier one is left.
    func begin() {
        waiting.withLock { $0.begin() }
    }

    /// Shard `index` has revoking work at APNs (in a step on its loop).
    func unsettled(_ index: Int) {
        waiting.withLock { $0.unsettled(index) }
    }

    /// Shard `index` has no revoking work at APNs left (in a step on its loop): the revocation's
    /// waiter to signal when it was the last such shard.
    func settled(_ index: Int) -> DispatchSemaphore? {
        waiting.withLock { $0.settled(index) }
    }

    /// On the poll thread, once every shard was marked: waits until the last shard with revoking
    /// work at APNs settled, up to the usual bound; while `awaitsRedis` (Redis failing, the
    /// relay not stopping) up to the Redis bound in all, then a backoff step or two for the
    /// records retrying once Redis answers (not when `stopping`). Returns at once when no shard
    /// has such work.
    func waitForWorkAtAPNs(_ partitions: [TopicPartition], awaitsRedis: () -> Bool, stopping: () -> Bool) {
        let semaphore = DispatchSemaphore(value: 0)
        guard waiting.withLock({ $0.wait(semaphore) }) else { return }
        // Well inside librdkafka's max.poll.interval.ms (300 s by default): the poll thread waits.
        let started = ContinuousClock.now
        var waited = semaphore.wait(timeout: .now() + .milliseconds(Int(bound.totalMilliseconds)))
        if waited == .timedOut, awaitsRedis() {
            logger.warning("revocation waits for Redis: answers from APNs wait for their records", metadata: [
                "kafka.partitions": "\(partitions.map(\.partition))",
            ])
            let limit = started + redisLimit
            while waited == .timedOut, awaitsRedis(), ContinuousClock.now < limit {
                waited = semaphore.wait(timeout: .now() + .seconds(1))
            }
            // Redis answers again: the records retrying land within a backoff step or two.
            let rest = min(limit - ContinuousClock.now, backoffMaximum + bound)
            if waited == .timedOut, !stopping(), rest > .zero {
                waited = semaphore.wait(timeout: .now() + .milliseconds(Int(rest.totalMilliseconds)))
            }
        }
        if waited == .timedOut {
            waiting.withLock { $0.gaveUp() }
            logger.warning("revocation goes on with work still at APNs (its next owner may send it again)", metadata: [
                "kafka.partitions": "\(partitions.map(\.partition))",
                "relay.waited_seconds": "\((ContinuousClock.now - started).components.seconds)",
            ])
        }
    }

    /// The consumer has counted `total` failed revocation commits: how many of them the metric
    /// has not seen yet (they are seen from now on).
    func commitFailuresNotCounted(_ total: Int) -> Int {
        commitFailuresCounted.withLock { counted in
            defer { counted = total }
            return total - counted
        }
    }
}
