import Redis
import RedisTesting
@testable import Relay
import Testing

/// The token bucket of a device and of a broadcast channel (a GCRA arrival time in Redis, see
/// RedisKeys) on a manual clock, spent by both of its writers in random order: the admission
/// (``DeviceAdmission/Bucket``, whose spend the relay writes back) and the mailbox take
/// (Scripts/take.lua). Whatever the arrival pattern: never more than `burst` plus one per
/// interval in any span of time, a refusal names the first moment a token is there, and the
/// two writers take the same decisions from the same stored time.
@Suite("Rate limit arithmetic", .timeLimit(.minutes(3)))
struct RateLimitArithmeticTests {
    static let topic = "com.example.app"

    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func neverMoreThanTheBucketAllows(seed: UInt64) async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        var generator = SplitMix(seed: seed)
        let refills: [Double] = [0.2, 0.5, 1, 3, 10, 2_000]
        var policy = RelayConfiguration.Policy()
        policy.defaults.rateLimit = .init(burst: Int(generator.next() % 6) + 1, refillPerSecond: refills[Int(generator.next() % 6)])
        policy.channels.rateLimit = .init(burst: Int(generator.next() % 6) + 1, refillPerSecond: refills[Int(generator.next() % 6)])
        for recipient in [String(repeating: "a1", count: 32), "channel:dHJhY2tpbmc="] {
            let limit = policy.rules(for: Self.topic, recipient: recipient).rateLimit
            #expect(limit == (recipient.hasPrefix("channel:") ? policy.channels.rateLimit : policy.defaults.rateLimit))
            let burst = Int64(limit.burst), interval = limit.intervalMilliseconds
            var now: Int64 = 1_732_000_000_000
            var admitted: [Int64] = []
            var taken = 0, refused = 0
            for index in 0..<400 {
                // Bursts and gaps: up to two buckets' worth between arrivals, mostly short.
                now += generator.next() % 4 == 0 ? Int64(generator.next() % UInt64(2 * burst * interval + 1))
                    : Int64(generator.next() % UInt64(interval / 2 + 1))
                let stored = try await client.send(RedisCommand("GET", [RedisKeys.standard.rate(token: recipient)])).integer
                var expected = DeviceAdmission.Bucket(limit, stored: stored, now: now)
                let allowed = expected.spend()
                if generator.next() % 2 == 0 {
                    // The admission: the relay writes the spent arrival time back.
                    if let arrival = expected.spent {
                        _ = try await client.send(RedisCommand("SET", [RedisKeys.standard.rate(token: recipient), arrival, "PX", arrival - now + 60_000]))
                    }
                } else {
                    // The mailbox take of a parked entry, due now.
                    let answer = try await Self.take(client, recipient: recipient, id: "i\(index)", limit: limit, now: now)
                    let storedAfter = try await client.send(RedisCommand("GET", [RedisKeys.standard.rate(token: recipient)])).integer
                    if allowed {
                        #expect(answer == [3], "take refused what the admission allows at \(now): \(answer)")
                        #expect(storedAfter == expected.spent)
                        taken += 1
                    } else {
                        #expect(answer == [2, expected.due], "take answered \(answer), the admission \(expected.due)")
                        #expect(storedAfter == stored)
                    }
                }
                if allowed {
                    admitted.append(now)
                } else {
                    refused += 1
                    // The due time is the first moment the bucket has a token again.
                    #expect(expected.due > now)
                    var atDue = DeviceAdmission.Bucket(limit, stored: stored, now: expected.due)
                    var before = DeviceAdmission.Bucket(limit, stored: stored, now: expected.due - 1)
                    #expect(atDue.spend() && !before.spend(), "due \(expected.due) is not the first moment")
                }
            }
            // Never more than the burst plus one per whole interval, in any span of time.
            for first in admitted.indices {
                for last in first..<admitted.count {
                    let allowed = burst + (admitted[last] - admitted[first]) / interval
                    if Int64(last - first + 1) > allowed {
                        Issue.record("\(last - first + 1) sends in \(admitted[last] - admitted[first]) ms, burst \(burst), interval \(interval) ms")
                        return
                    }
                }
            }
            // The pattern met both sides of the limit, and both writers.
            #expect(refused > 0 && admitted.count > Int(burst) && taken > 0, "\(recipient): \(admitted.count) sent, \(refused) refused, \(taken) taken")
        }
        await client.shutdown()
    }

    /// Scripts/take.lua on a mailbox whose parked entry `id` is due, with nothing else in the
    /// way (no backoff, no answer recorded): the script's code, and for a refusal the time it
    /// names.
    static func take(_ client: RedisClient, recipient: String, id: String, limit: RelayConfiguration.Policy.RateLimit,
                     now: Int64) async throws -> [Int64] {
        let keys = RedisKeys.standard, mailbox = keys.mailbox(token: recipient, topic: topic)
        _ = try await client.pipeline([
            RedisCommand("DEL", [mailbox]),
            RedisCommand("HSET", [mailbox, "pid", id, "p", "entry", "pe", now / 1000 + 3600]),
        ])
        let replies = try await client.pipelineLoading([DevicePolicy.takeScript], [
            RedisCommand.evalsha(DevicePolicy.takeScript,
                                 keys: [mailbox, keys.rate(token: recipient), keys.seen(token: recipient, topic: topic, id: id),
                                        keys.backoff(token: recipient), keys.waiting(token: recipient, topic: topic)],
                                 arguments: [id, now, limit.burst, limit.intervalMilliseconds, 30_000, "arithmetic"]),
        ])
        guard let values = replies[0].array, let code = values.first?.integer else { return [-1] }
        return code == 2 ? [code, values[1].integer ?? -1] : [code]
    }
}
