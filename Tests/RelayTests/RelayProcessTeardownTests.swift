import Foundation
import Testing

@Suite("Relay processes of failed tests", .timeLimit(.minutes(1)))
struct RelayProcessTeardownTests {
    /// A test that throws before it stopped its relay process releases it: the process is
    /// killed and reaped, not left running after the tests.
    @Test func aReleasedRelayProcessIsKilled() async throws {
        let harness = try await ProcessHarness.start()
        var relay: RelayProcess? = try RelayProcess.start(config: try writeConfig(harness: harness))
        let pid = try #require(relay?.process.pid)
        #expect(kill(pid, 0) == 0)
        relay = nil
        // Reaped: the pid names no process (not even a zombie) any more.
        let signalled = kill(pid, 0), error = errno
        #expect(signalled == -1 && error == ESRCH)
        _ = relay
        await harness.simulator.stop()
    }
}
