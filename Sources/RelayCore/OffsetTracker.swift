import NIOCore

/// Which offsets of one partition are still being worked on, and up to where everything is done.
///
/// Offsets enter in increasing order (as Kafka hands them out) and finish in any order; the
/// committable position only moves past an offset once it and everything before it finished.
public struct OffsetTracker: Sendable {
    private var pending = CircularBuffer<Int64>()
    private var finished = Set<Int64>()
    /// The highest offset finished with everything before it finished.
    public private(set) var committable: Int64?

    public init() {}

    public var inFlight: Int { pending.count - finished.count }
    /// Offsets started and not yet committable (finished ones behind an unfinished one
    /// included): what this tracker holds in memory.
    public var uncommitted: Int { pending.count }

    public mutating func started(_ offset: Int64) {
        pending.append(offset)
    }

    /// Marks `offset` finished; returns the new committable offset when it moved.
    public mutating func finish(_ offset: Int64) -> Int64? {
        guard let first = pending.first else { return nil }
        if offset != first {
            finished.insert(offset)
            return nil
        }
        pending.removeFirst()
        var last = offset
        while let next = pending.first, finished.remove(next) != nil {
            pending.removeFirst()
            last = next
        }
        committable = last
        return last
    }
}
