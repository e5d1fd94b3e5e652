/// When the consumer stops and restarts fetching, apart from librdkafka: a value type fed with
/// what the poll thread, the rebalance callback and the application report, answering which
/// partitions to pause or resume.
///
/// - After each poll, while the hand-over buffer holds `capacity` records or more, the poll
///   thread holds off polling (librdkafka keeps its bounded prefetch; nothing is purged and
///   fetched again) until the application brought it down to half.
/// - If that takes longer than `holdLimit`, every assigned partition is paused and polling goes
///   on, so that rebalances and the group session keep being served; they resume once the
///   buffer is down to half.
/// - Partitions the application paused stay paused until it resumes them, and do not resume
///   while the buffer is full. Partitions assigned while it is full start paused.
public struct ConsumerFlowControl: Sendable {
    public enum Decision: Sendable, Equatable {
        /// Poll again.
        case poll
        /// Hold off: check again shortly (the application is behind).
        case hold
        /// Pause these partitions, then poll.
        case pause([TopicPartition])
        /// Resume these partitions, then poll.
        case resume([TopicPartition])
    }

    public let capacity: Int
    public let holdLimit: Duration
    public private(set) var assigned: Set<TopicPartition> = []
    public private(set) var pausedByApplication: Set<TopicPartition> = []
    /// Every assigned partition is paused because the application is behind.
    public private(set) var bufferFull = false
    private var holdingUntil: ContinuousClock.Instant?
    private var closed = false

    public init(capacity: Int, holdLimit: Duration = .seconds(5)) {
        self.capacity = max(capacity, 1)
        self.holdLimit = holdLimit
    }

    private var resumeLevel: Int { capacity / 2 }

    /// After a poll (or a hold), with `buffered` records waiting for the application.
    public mutating func decide(buffered: Int, now: ContinuousClock.Instant) -> Decision {
        if closed { return .poll }
        if let until = holdingUntil {
            if buffered <= resumeLevel {
                holdingUntil = nil
                return .poll
            }
            guard now >= until else { return .hold }
            holdingUntil = nil
            bufferFull = true
            return .pause(Self.sorted(assigned))
        }
        if !bufferFull, buffered >= capacity {
            holdingUntil = now + holdLimit
            return .hold
        }
        if bufferFull, buffered <= resumeLevel {
            bufferFull = false
            let resumable = assigned.subtracting(pausedByApplication)
            return resumable.isEmpty ? .poll : .resume(Self.sorted(resumable))
        }
        return .poll
    }

    /// The consumer is closing: no more holding (nobody reads the buffer any more).
    public mutating func closing() {
        holdingUntil = nil
        closed = true
    }

    /// A rebalance assigned `partitions`: the ones to pause right away (all of them while the
    /// buffer is full, else none).
    public mutating func assigned(_ partitions: [TopicPartition]) -> [TopicPartition] {
        assigned.formUnion(partitions)
        return bufferFull ? partitions : []
    }

    public mutating func revoked(_ partitions: [TopicPartition]) {
        assigned.subtract(partitions)
        pausedByApplication.subtract(partitions)
    }

    /// The whole assignment is gone (a failed rebalance): the partitions that were assigned.
    public mutating func lostAssignment() -> [TopicPartition] {
        defer {
            assigned.removeAll()
            pausedByApplication.removeAll()
        }
        return Self.sorted(assigned)
    }

    /// The application pauses `partitions` (always done at once).
    public mutating func applicationPaused(_ partitions: [TopicPartition]) {
        pausedByApplication.formUnion(partitions)
    }

    /// The application resumes `partitions`: the ones to resume now (none while the buffer is
    /// full; they resume with the others).
    public mutating func applicationResumed(_ partitions: [TopicPartition]) -> [TopicPartition] {
        pausedByApplication.subtract(partitions)
        return bufferFull ? [] : partitions
    }

    private static func sorted(_ partitions: Set<TopicPartition>) -> [TopicPartition] {
        partitions.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) }
    }
}
