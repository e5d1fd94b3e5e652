public import NIOCore
import Synchronization

/// The answers recorded while admission reads of Redis were under way. A batch's admission reads
/// its intents' dedupe records when the batch is consumed, and admits each intent later (after
/// the batches before it, and when there is room under `limits.max_in_flight`). A copy of an
/// intent whose first copy was answered — its record written — between the two cannot have seen
/// that record; ``answered(_:since:)`` says so, and the copy is decided again in its turn. The
/// relay keeps its devices' parks here too (a key per mailbox parked into): an intent whose read
/// came before its device's earlier intent parked would overtake that one.
///
/// Bounded by the reads under way: an answer is kept only while a read that began before it has
/// not ended, so when reads come and go as batches do, only the answers of the last few batches'
/// time are held; and by `capacity`: past it the oldest answers go, and a read that began before
/// one of them counts as having missed every key (more intents decided again, never one sent
/// twice). A pure value, confined with its pipeline shard to the shard's event loop.
public struct RecentAnswers<Key: Hashable> {
    /// Answers held at most (a lane that holds a batch long while others press keeps theirs).
    public let capacity: Int
    /// The mark of the latest answer let go for the capacity.
    @usableFromInline var evictedThrough: UInt64 = 0
    /// Reads under way, by the mark each began at (how many began there).
    @usableFromInline var reads: [UInt64: Int] = [:]
    /// Answers so far: an answer's mark is this count after it.
    @usableFromInline var count: UInt64 = 0
    /// The answers kept, in order: (mark, key).
    @usableFromInline var order = CircularBuffer<(mark: UInt64, key: Key)>()
    /// Per key kept, the mark of its latest answer.
    @usableFromInline var latest: [Key: UInt64] = [:]

    /// Answers held now.
    @inlinable public var held: Int { latest.count }
    /// The mark of the latest answer (0 before the first): a read marked at or after it missed
    /// none of the answers so far.
    @inlinable public var latestMark: UInt64 { count }

    public init(capacity: Int = 100_000) {
        self.capacity = capacity
    }

    /// A read begins: its mark, for ``answered(_:since:)`` and ``readEnded(_:)``.
    @inlinable
    public mutating func readBegan() -> UInt64 {
        reads[count, default: 0] += 1
        return count
    }

    /// The read marked `mark` ended: the answers no read under way began before go.
    @inlinable
    public mutating func readEnded(_ mark: UInt64) {
        guard let running = reads[mark] else { return }
        reads[mark] = running > 1 ? running - 1 : nil
        guard let oldest = reads.keys.min() else {
            order.removeAll(keepingCapacity: true)
            latest.removeAll(keepingCapacity: true)
            return
        }
        while let first = order.first, first.mark <= oldest { dropOldest() }
    }

    /// An answer for `key` was recorded (or whatever else a read begun before now cannot see).
    @inlinable
    public mutating func answered(_ key: Key) {
        count += 1
        guard !reads.isEmpty else { return }
        if order.count >= capacity {
            evictedThrough = order.first?.mark ?? evictedThrough
            dropOldest()
        }
        order.append((count, key))
        latest[key] = count
    }

    @inlinable
    mutating func dropOldest() {
        let first = order.removeFirst()
        if latest[first.key] == first.mark { latest[first.key] = nil }
    }

    /// Whether an answer for `key` was recorded after the read marked `mark` began (true for
    /// every key when answers after it were let go for the capacity).
    @inlinable
    public func answered(_ key: Key, since mark: UInt64) -> Bool {
        if mark < evictedThrough { return true }
        // Mostly empty (no answer recorded while a read was under way): no hashing then.
        guard !latest.isEmpty, let answered = latest[key] else { return false }
        return answered > mark
    }
}

/// A batch's admission read of Redis under way, from ``RelayPipeline/startAdmission(_:)`` until
/// its last intent was admitted (``end()``), or the batch was let go unadmitted as the relay
/// stops: then it ends in the pipeline's ``RecentAnswers``, once. `marks`: where the read began
/// in each shard's ``RecentAnswers`` (each shard counts its own), by shard.
package final class AdmissionRead: Sendable {
    package let marks: [UInt64]
    private let ended: @Sendable ([UInt64]) -> Void
    private let done = Atomic<Bool>(false)

    package init(marks: [UInt64], ended: @escaping @Sendable ([UInt64]) -> Void) {
        self.marks = marks
        self.ended = ended
    }

    package func end() {
        if !done.exchange(true, ordering: .relaxed) { ended(marks) }
    }

    deinit { end() }
}
