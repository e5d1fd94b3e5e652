/// Checks `condition` every 20 ms until it holds; throws after `timeout`, naming the call's
/// place. For states that no event announces (what librdkafka holds in its queues, a readiness
/// flag).
public func waitUntil(timeout: Duration = .seconds(20), fileID: String = #fileID, line: Int = #line,
                      _ condition: () -> Bool) async throws {
    try await waitUntil(timeout: timeout, fileID: fileID, line: line, asking: condition)
}

/// ``waitUntil(timeout:fileID:line:_:)`` for a condition that has to ask something (Redis, say).
public func waitUntil(timeout: Duration = .seconds(20), fileID: String = #fileID, line: Int = #line,
                      asking condition: () async -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while await !condition() {
        guard ContinuousClock.now < deadline else { throw ConditionTimedOut(place: "\(fileID):\(line)", timeout: timeout) }
        try await Task.sleep(for: .milliseconds(20))
    }
}

/// A ``waitUntil(timeout:fileID:line:_:)`` whose condition never held.
public struct ConditionTimedOut: Error, CustomStringConvertible {
    public var place: String
    public var timeout: Duration

    public init(place: String, timeout: Duration) {
        self.place = place
        self.timeout = timeout
    }

    public var description: String { "the condition at \(place) did not hold within \(timeout)" }
}
