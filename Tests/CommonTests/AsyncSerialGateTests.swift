import Common
import Testing

/// The limit is a hang detector: 160,000 passes take 0.4 s alone, 10-20 s beside the whole suite
/// on two cores, and once more than a minute in a clean clone's loaded run (the defect the second
/// test guards against would hang it for good).
@Suite("AsyncSerialGate", .timeLimit(.minutes(3)))
struct AsyncSerialGateTests {
    /// Tasks inside the gate now, and the most there ever were.
    final class Occupancy: Sendable {
        let counts = Locked((inside: 0, most: 0))
        func enter() { counts.withLock { $0.inside += 1; $0.most = max($0.most, $0.inside) } }
        func leave() { counts.withLock { $0.inside -= 1 } }
    }

    @Test func oneTaskAtATime() async {
        let gate = AsyncSerialGate()
        let occupancy = Occupancy()
        let entered = AsyncLatch(), release = AsyncLatch()
        await withTaskGroup(of: Void.self) { group in
            // The first holds the gate until the others wait for it.
            group.addTask {
                _ = await gate.run {
                    entered.open()
                    await release.wait()
                }
            }
            await entered.wait()
            for _ in 0..<20 {
                group.addTask {
                    _ = await gate.run {
                        occupancy.enter()
                        await Task.yield()
                        occupancy.leave()
                    }
                }
            }
            release.open()
        }
        #expect(occupancy.counts.withLock { $0.most } == 1)
    }

    /// Tasks arriving while the one inside leaves: each gets through. A task that found the
    /// gate busy and had not yet queued when the last one inside left was never let in (the
    /// gate opened with it still to queue), and its group never ended.
    @Test func aTaskArrivingAsTheLastOneLeavesGetsThrough() async {
        let gate = AsyncSerialGate()
        for _ in 0..<20_000 {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<8 {
                    group.addTask { _ = await gate.run {} }
                }
            }
        }
    }

    @Test func aCancelledWaiterLeavesWithoutRunning() async {
        let gate = AsyncSerialGate()
        let entered = AsyncLatch(), release = AsyncLatch()
        let holder = Task {
            _ = await gate.run {
                entered.open()
                await release.wait()
            }
        }
        await entered.wait()
        let ran = AsyncLatch()
        let waiter = Task { await gate.run { ran.open() } }
        waiter.cancel()
        #expect(await waiter.value == nil)
        #expect(!ran.isOpen)
        release.open()
        await holder.value
        // The gate is free again.
        #expect(await gate.run { 7 } == 7)
    }
}
