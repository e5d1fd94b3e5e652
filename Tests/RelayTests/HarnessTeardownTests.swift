import Common
import Testing

/// `.stopsItsRelays`: a test that throws half-way still stops the relay it started.
@Suite("Relay harness teardown", .timeLimit(.minutes(1)))
struct HarnessTeardownTests {
    struct HalfWay: Error {}

    @Test func aTestThatThrowsStillStopsItsRelay() async throws {
        let started = Locked<RelayHarness?>(nil)
        let scope = StopsItsRelays()
        await #expect(throws: HalfWay.self) {
            try await scope.provideScope(for: Test.current!, testCase: Test.Case.current) {
                let harness = try await RelayHarness.start()
                started.withLock { $0 = harness }
                throw HalfWay()
            }
        }
        let harness = try #require(started.withLock { $0 })
        // Stopped by the scope: the relay's task has ended, and stopping again does nothing.
        #expect(!harness.stopState.markStopped())
        await harness.running.value
        #expect(harness.pipeline.outcomeCounts.isEmpty)
    }
}
