public import Common
import Foundation

/// Checks `condition` every 20 ms until it holds; throws after `timeout`, naming the call's
/// place and its source line. Only for states that no event announces (what librdkafka holds
/// in its queues, a Redis key another process writes): where the code has an event, await it
/// (``AsyncWatched/waitUntil(timeout:fileID:filePath:line:_:)``).
public func waitUntil(timeout: Duration = .seconds(20), fileID: String = #fileID, filePath: String = #filePath, line: Int = #line,
                      _ condition: () -> Bool) async throws {
    try await waitUntil(timeout: timeout, fileID: fileID, filePath: filePath, line: line, asking: condition)
}

/// ``waitUntil(timeout:fileID:filePath:line:_:)`` for a condition that has to ask something (Redis, say).
public func waitUntil(timeout: Duration = .seconds(20), fileID: String = #fileID, filePath: String = #filePath, line: Int = #line,
                      asking condition: () async -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while await !condition() {
        guard ContinuousClock.now < deadline else {
            throw ConditionTimedOut(place: "\(fileID):\(line)", timeout: timeout, waitedFor: sourceLine(filePath, line))
        }
        try await Task.sleep(for: .milliseconds(20))
    }
}

extension AsyncWatched {
    /// Waits until `condition` holds for the value; throws ``ConditionTimedOut`` after
    /// `timeout`, naming the place, its source line and the value last seen.
    public func waitUntil(timeout: Duration = .seconds(20), fileID: String = #fileID, filePath: String = #filePath, line: Int = #line,
                          _ condition: @escaping @Sendable (Value) -> Bool) async throws {
        guard await wait(atMost: timeout, until: condition) else {
            throw ConditionTimedOut(place: "\(fileID):\(line)", timeout: timeout, waitedFor: sourceLine(filePath, line),
                                    lastValue: "\(value)")
        }
    }
}

/// The text of a source line (what a wait there waited for), trimmed; nil when unreadable.
func sourceLine(_ filePath: String, _ line: Int) -> String? {
    guard let text = try? String(contentsOfFile: filePath, encoding: .utf8) else { return nil }
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
    guard line >= 1, line <= lines.count else { return nil }
    return lines[line - 1].trimmingCharacters(in: .whitespaces)
}

/// A wait whose condition never held: where, what it waited for (its source line) and, when
/// known, the value it last saw.
public struct ConditionTimedOut: Error, CustomStringConvertible {
    public var place: String
    public var timeout: Duration
    public var waitedFor: String?
    public var lastValue: String?

    public init(place: String, timeout: Duration, waitedFor: String? = nil, lastValue: String? = nil) {
        self.place = place
        self.timeout = timeout
        self.waitedFor = waitedFor
        self.lastValue = lastValue
    }

    public var description: String {
        var text = "the condition at \(place) did not hold within \(timeout)"
        if let waitedFor { text += ": \(waitedFor)" }
        if let lastValue { text += "; last seen: \(lastValue)" }
        return text
    }
}
