import Foundation
import Synchronization

/// A dedicated thread that calls `body` over and over until stopped. librdkafka's blocking
/// polls run here, never on Swift's cooperative pool or an event loop.
final class PollThread: Sendable {
    private final class Flag: Sendable {
        let running = Atomic<Bool>(true)
    }

    private let flag = Flag()
    private let finished = DispatchSemaphore(value: 0)

    init(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread { [flag, finished] in
            while flag.running.load(ordering: .relaxed) { body() }
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Asks the thread to stop and waits until its current `body` call returned. Idempotent.
    func stop() {
        if flag.running.exchange(false, ordering: .relaxed) {
            finished.wait()
        }
    }
}

/// Runs a blocking call on a thread of its own and waits for it without blocking the caller's.
func runBlocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: body()) }
        thread.name = "kafka-blocking-call"
        thread.start()
    }
}
