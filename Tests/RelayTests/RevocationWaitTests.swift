@testable import Relay
import Testing

/// A revocation whose partitions are on two shards waits for both: the waiter is woken by the
/// last shard to settle, whichever order they settle in, and not at all when they settled before
/// it began to wait.
@Suite("Revocation across shards")
struct RevocationWaitTests {
    @Test func theLastShardToSettleWakesTheWaiter() {
        var wait = RevocationWait<String>()
        wait.begin()
        wait.unsettled(0)
        wait.unsettled(1)
        let waits = wait.wait("poll thread")
        #expect(waits)
        let first = wait.settled(1), again = wait.settled(1)
        #expect(first == nil, "shard 0 still has work at APNs")
        #expect(again == nil, "a shard settles once")
        let last = wait.settled(0)
        #expect(last == "poll thread")
        #expect(wait.waiter == nil && wait.unsettled.isEmpty)
    }

    @Test func shardsThatSettledBeforeTheWaitLeaveNothingToWaitFor() {
        var wait = RevocationWait<String>()
        wait.begin()
        wait.unsettled(0)
        wait.unsettled(1)
        let early = [wait.settled(0), wait.settled(1)]
        #expect(early == [nil, nil], "nobody waits yet")
        let waits = wait.wait("poll thread")
        #expect(!waits, "every shard settled: the revocation goes on at once")
        #expect(wait.waiter == nil)

        // One settles before the wait, the other after it.
        wait.begin()
        wait.unsettled(0)
        wait.unsettled(1)
        let before = wait.settled(0)
        let waitsAgain = wait.wait("poll thread")
        let after = wait.settled(1)
        #expect(before == nil && waitsAgain && after == "poll thread")
    }

    @Test func aWaiterThatGaveUpLeavesNoMarkForTheNextRevocation() {
        var wait = RevocationWait<String>()
        wait.begin()
        wait.unsettled(0)
        wait.unsettled(1)
        let waits = wait.wait("first"), settled = wait.settled(0)
        #expect(waits && settled == nil)
        wait.gaveUp()
        // The next revocation's partitions are all on shard 0: shard 1's old mark must not hold it.
        wait.begin()
        wait.unsettled(0)
        let secondWaits = wait.wait("second"), woken = wait.settled(0), stale = wait.settled(1)
        #expect(secondWaits && woken == "second" && stale == nil)
    }
}
