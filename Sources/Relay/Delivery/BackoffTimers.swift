import Common
import NIOCore

/// Retries driven by callbacks waiting out their backoff: a timer each on an event loop
/// (`scheduleTask`), not a task each. The shutdown deadline (``abandonAll()``) ends every one
/// still waiting at once, and one scheduled after it as it is scheduled, as cancelling a task
/// ends its `Task.sleep`.
///
/// Bounded by the intents in flight (`limits.max_in_flight`): each waits here at most once at
/// a time.
final class BackoffTimers: Sendable {
    private struct Timer {
        let scheduled: Scheduled<Void>
        let loop: any EventLoop
        let fire: @Sendable (_ abandoned: Bool) -> Void
    }

    private struct Waiting {
        var next = 0
        var timers: [Int: Timer] = [:]
        var abandoned = false
    }

    private let state = Locked(Waiting())

    init() {}

    /// Retries waiting now.
    var count: Int { state.withLock { $0.timers.count } }

    /// Calls `fire(false)` on `loop` once `delay` has passed, or `fire(true)` at the shutdown
    /// deadline if that comes first (at once when it has come). Exactly one of them, once, and
    /// on `loop` either way: what it fires is confined there (its item's shard).
    func schedule(in delay: TimeAmount, on loop: any EventLoop, _ fire: @escaping @Sendable (_ abandoned: Bool) -> Void) {
        let waiting = state.withLock { waiting -> Bool in
            guard !waiting.abandoned else { return false }
            let id = waiting.next
            waiting.next &+= 1
            // Scheduled under the lock: the timer takes it to find itself, so it cannot fire
            // before it is here.
            let scheduled = loop.scheduleTask(in: delay) { [self] in
                guard let timer = state.withLock({ $0.timers.removeValue(forKey: id) }) else { return }
                timer.fire(false)
            }
            waiting.timers[id] = Timer(scheduled: scheduled, loop: loop, fire: fire)
            return true
        }
        if !waiting { Self.fireAbandoned(fire, on: loop) }
    }

    /// The shutdown deadline: every retry waiting, and every one scheduled from now on, is
    /// told it was abandoned.
    func abandonAll() {
        let timers = state.withLock { waiting -> [Timer] in
            waiting.abandoned = true
            defer { waiting.timers = [:] }
            return Array(waiting.timers.values)
        }
        for timer in timers {
            timer.scheduled.cancel()
            Self.fireAbandoned(timer.fire, on: timer.loop)
        }
    }

    /// `fire(true)` on `loop`: at once when called there, else in a turn of it.
    private static func fireAbandoned(_ fire: @escaping @Sendable (_ abandoned: Bool) -> Void, on loop: any EventLoop) {
        guard loop.inEventLoop else { return loop.execute { fire(true) } }
        fire(true)
    }
}
