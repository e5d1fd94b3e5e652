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
/// - The application's pauses and resumes are wishes: the poll thread applies them on its next
///   turn (``applicationChanges()``), so that the application never waits for librdkafka (its
///   pause and resume calls wait for the partitions' broker threads, without a deadline).
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
    /// What the application wants paused (applied or not yet).
    public private(set) var pausedByApplication: Set<TopicPartition> = []
    /// What is paused in librdkafka now, whatever the reason: what a revocation resumes
    /// (librdkafka keeps a partition paused across its unassignment).
    public private(set) var paused: Set<TopicPartition> = []
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
            paused = assigned
            return .pause(Self.sorted(assigned))
        }
        if !bufferFull, buffered >= capacity {
            holdingUntil = now + holdLimit
            return .hold
        }
        if bufferFull, buffered <= resumeLevel {
            bufferFull = false
            let resumable = paused.subtracting(pausedByApplication)
            paused.subtract(resumable)
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
        guard bufferFull else { return [] }
        paused.formUnion(partitions)
        return partitions
    }

    /// A rebalance revoked `partitions`: the ones paused in librdkafka, to resume before they
    /// are unassigned (else they would come back paused if they are assigned here again).
    public mutating func revoked(_ partitions: [TopicPartition]) -> [TopicPartition] {
        assigned.subtract(partitions)
        pausedByApplication.subtract(partitions)
        let resume = partitions.filter { paused.contains($0) }
        paused.subtract(partitions)
        return resume
    }

    /// The whole assignment is gone (a failed rebalance): the partitions that were assigned,
    /// and those of them paused in librdkafka (to resume).
    public mutating func lostAssignment() -> (assigned: [TopicPartition], paused: [TopicPartition]) {
        defer {
            assigned.removeAll()
            pausedByApplication.removeAll()
            paused.removeAll()
        }
        return (Self.sorted(assigned), Self.sorted(paused))
    }

    /// The application wants `partitions` paused (``applicationChanges()`` applies it); those
    /// not assigned now are left out (a wish made just as a rebalance took them would
    /// otherwise pause them when they come back, with nobody left to resume them).
    public mutating func applicationPaused(_ partitions: [TopicPartition]) {
        pausedByApplication.formUnion(partitions.filter(assigned.contains))
    }

    /// The application wants `partitions` resumed (``applicationChanges()`` applies it; not
    /// while the buffer is full: they resume with the others).
    public mutating func applicationResumed(_ partitions: [TopicPartition]) {
        pausedByApplication.subtract(partitions)
    }

    /// On the poll thread: what to pause and resume in librdkafka now for the application's
    /// wishes since the last call, counted as done. Assigned partitions only; nothing while the
    /// buffer is full (every assigned partition is paused then).
    public mutating func applicationChanges() -> (pause: [TopicPartition], resume: [TopicPartition]) {
        guard !bufferFull else { return ([], []) }
        let wanted = pausedByApplication.intersection(assigned)
        let pause = wanted.subtracting(paused)
        let resume = paused.subtracting(wanted)
        paused = wanted
        return (Self.sorted(pause), Self.sorted(resume))
    }

    private static func sorted(_ partitions: Set<TopicPartition>) -> [TopicPartition] {
        partitions.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) }
    }
}
