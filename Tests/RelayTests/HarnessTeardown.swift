import Common
import Synchronization
import Testing

/// The relay harnesses a test started, stopped when the test ends however it ends: a `try`
/// that throws half-way no longer leaves a relay consuming, sending and holding its Kafka
/// cluster for the rest of the run (`.stopsItsRelays`, on every suite that starts one).
final class StartedHarnesses: Sendable {
    @TaskLocal static var current: StartedHarnesses?

    private let started = Locked<[RelayHarness]>([])

    func add(_ harness: RelayHarness) {
        started.withLock { $0.append(harness) }
    }

    /// Stops every harness the test did not stop itself.
    func stopAll() async {
        for harness in started.withLock({ list in defer { list = [] }; return list }) {
            await harness.stop()
        }
    }
}

/// Stops the relay harnesses each test of the suite started (``StartedHarnesses``).
struct StopsItsRelays: TestTrait, SuiteTrait, TestScoping {
    var isRecursive: Bool { true }

    func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        guard testCase != nil else { return try await function() }
        let started = StartedHarnesses()
        do {
            try await StartedHarnesses.$current.withValue(started) { try await function() }
        } catch {
            await started.stopAll()
            throw error
        }
        await started.stopAll()
    }
}

extension Trait where Self == StopsItsRelays {
    /// Stops the relay harnesses a test started when it ends, failed or not.
    static var stopsItsRelays: Self { StopsItsRelays() }
}

/// Whether a harness was stopped (``RelayHarness/stop()`` runs once).
final class HarnessStopState: Sendable {
    private let stopped = Atomic(false)

    /// True the first time only.
    func markStopped() -> Bool {
        !stopped.exchange(true, ordering: .acquiringAndReleasing)
    }
}
