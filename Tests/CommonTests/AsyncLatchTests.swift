import Common
import Testing

@Suite("AsyncLatch", .timeLimit(.minutes(3)))
struct AsyncLatchTests {
    @Test func everyWaiterBeforeAndAfterOpeningGoesOn() async {
        let latch = AsyncLatch()
        #expect(!latch.isOpen)
        await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<10 { group.addTask { await latch.wait() } }
            latch.open()
            for await opened in group { #expect(opened) }
        }
        #expect(latch.isOpen)
        #expect(await latch.wait())
        latch.open()
        #expect(latch.isOpen)
    }

    @Test func aCancelledWaiterStopsWaiting() async {
        let latch = AsyncLatch()
        let waiter = Task { await latch.wait() }
        waiter.cancel()
        #expect(await waiter.value == false)
        #expect(!latch.isOpen)
    }

    @Test func aBoundedWaitEndsAtItsDurationOrWhenTheLatchOpens() async {
        let latch = AsyncLatch()
        let clock = ContinuousClock()
        let started = clock.now
        #expect(await latch.wait(atMost: .milliseconds(50)) == false)
        #expect(clock.now - started >= .milliseconds(50))
        let opening = Task { await latch.wait(atMost: .seconds(60)) }
        latch.open()
        #expect(await opening.value)
    }
}

@Suite("Backoff", .timeLimit(.minutes(3)))
struct BackoffTests {
    @Test func doublesUpToTheMaximumWithJitterInTheUpperHalf() {
        let backoff = Backoff(base: .milliseconds(100), maximum: .seconds(1))
        for attempt in 0..<8 {
            let ceiling = min(Duration.milliseconds(100) * (1 << attempt), .seconds(1))
            for _ in 0..<50 {
                let delay = backoff.delay(attempt: attempt)
                #expect(delay >= ceiling / 2 && delay <= ceiling, "attempt \(attempt): \(delay)")
            }
        }
    }

    @Test func withoutJitterTheWaitIsTheCeiling() {
        let backoff = Backoff(base: .seconds(1), maximum: .seconds(10), jitter: false)
        #expect((0..<6).map(backoff.delay(attempt:)) == [.seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(10), .seconds(10)])
    }
}
