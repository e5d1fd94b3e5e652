import Foundation

/// How much slower than a plain build this test process runs: `scripts/test` sets
/// `APNS_RELAY_TEST_SLOWDOWN` under a sanitizer (3 with the thread sanitizer, 2 with the address
/// sanitizer); 1 otherwise. Upper bounds on elapsed time that a loaded sanitizer run overshot
/// (latencies, not deadlines a test waits for) are multiplied by it: `slowed(.seconds(10))`.
public let sanitizerSlowdown: Int = {
    guard let text = ProcessInfo.processInfo.environment["APNS_RELAY_TEST_SLOWDOWN"], let factor = Int(text), factor >= 1
    else { return 1 }
    return factor
}()

/// `bound` stretched by ``sanitizerSlowdown``.
public func slowed(_ bound: Duration) -> Duration { bound * sanitizerSlowdown }
