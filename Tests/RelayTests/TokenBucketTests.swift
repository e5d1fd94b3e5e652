@testable import Relay
import PropertyBased
import Testing

/// The per-device token bucket (`DeviceAdmission.Bucket`, a GCRA arrival time) under random
/// arrivals: it never lets more than `burst` plus one per interval through in any window, and it
/// never refuses a send it says is due.
@Suite("Token bucket", .timeLimit(.minutes(3)))
struct TokenBucketTests {
    @Test func neverMoreThanBurstPlusTheRefillInAnyWindow() async {
        // Burst, refill interval (ms) and the gaps between arrivals, in eighths of the time a
        // burst takes to refill (0: at once).
        await propertyCheck(count: 200, input: Gen.int(in: 1...10), Gen.int(in: 1...2000), Gen.int(in: 0...8).array(of: 300...300)) { burst, every, gaps in
            let limit = RelayConfiguration.Policy.RateLimit(burst: burst, refillPerSecond: 1000 / Double(every))
            Self.check(limit, burst: burst, gaps: gaps)
        }
    }

    static func check(_ limit: RelayConfiguration.Policy.RateLimit, burst: Int, gaps: [Int]) {
        let interval = limit.intervalMilliseconds
        var stored: Int64?
        var now: Int64 = 1_700_000_000_000
        var sends: [Int64] = []
        for gap in gaps {
            now += Int64(gap) * interval * 3 / max(Int64(burst), 1) / 8
            var bucket = DeviceAdmission.Bucket(limit, stored: stored, now: now)
            if bucket.spend() {
                sends.append(now)
                stored = bucket.spent
            } else {
                // Refused: the time it names is later, and a send then goes through.
                #expect(bucket.due > now)
                var then = DeviceAdmission.Bucket(limit, stored: stored, now: bucket.due)
                let spent = then.spend()
                #expect(spent, "due \(bucket.due) refused")
            }
        }
        #expect(!sends.isEmpty)
        // In every window from one send to a later one: at most burst + one per whole interval.
        for first in sends.indices {
            for last in first..<sends.count {
                let allowed = Int64(burst) + (sends[last] - sends[first]) / interval
                #expect(Int64(last - first + 1) <= allowed, "\(last - first + 1) sends in \(sends[last] - sends[first]) ms, burst \(burst), interval \(interval) ms")
            }
        }
    }
}
