/// Checks `condition` every 20 ms until it holds; throws after `timeout`. For states that no
/// event announces (what librdkafka holds in its queues, a readiness flag).
public func waitUntil(timeout: Duration = .seconds(20), _ condition: () -> Bool) async throws {
    try await waitUntil(timeout: timeout, asking: condition)
}

/// ``waitUntil(timeout:_:)`` for a condition that has to ask something (Redis, say).
public func waitUntil(timeout: Duration = .seconds(20), asking condition: () async -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while await !condition() {
        guard ContinuousClock.now < deadline else { throw ConditionTimedOut() }
        try await Task.sleep(for: .milliseconds(20))
    }
}

public struct ConditionTimedOut: Error {}
