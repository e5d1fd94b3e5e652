@testable import Relay
import Testing

/// ``LaneLedger``: weighted shares of in-flight capacity, backlogs that pause and resume.
@Suite("Lane ledger", .timeLimit(.minutes(1)))
struct LaneLedgerTests {
    @Test func aLaneAloneMayUseEverything() {
        var ledger = LaneLedger(weights: [8, 1], maxInFlight: 90, maxWaiting: 10)
        _ = ledger.consumed(1, records: 500)
        for _ in 0..<89 { ledger.admitted(1) }
        #expect(ledger.hasRoom(1))
        ledger.admitted(1)
        #expect(!ledger.hasRoom(1) && !ledger.hasRoom(0))
    }

    @Test func whileAnotherLanePressesEachGetsItsWeightedShare() {
        var ledger = LaneLedger(weights: [8, 1], maxInFlight: 90, maxWaiting: 10)
        _ = ledger.consumed(1, records: 500)
        for _ in 0..<90 { ledger.admitted(1) }
        // The urgent lane gets work: the bulk lane is far above its share of 10.
        _ = ledger.consumed(0, records: 50)
        #expect(ledger.share(0) == 80 && ledger.share(1) == 10)
        // Nothing is free yet; each slot the bulk lane frees goes to the urgent lane.
        #expect(!ledger.hasRoom(0) && !ledger.hasRoom(1))
        ledger.finished(1)
        #expect(ledger.hasRoom(0) && !ledger.hasRoom(1))
        // Down to its share, the bulk lane goes on (no starvation).
        for _ in 0..<80 { ledger.finished(1) }
        for _ in 0..<70 { ledger.admitted(0) }
        #expect(ledger.hasRoom(1))
        // Once the urgent backlog is admitted the bulk lane may fill what is free again.
        _ = ledger.taken(0, records: 50)
        #expect(ledger.share(1) == 90)
    }

    @Test func waitingIntentsTakeNoSendSlotButAreBounded() {
        var ledger = LaneLedger(weights: [1], maxInFlight: 2, maxWaiting: 2)
        ledger.admitted(0)
        ledger.admitted(0)
        #expect(!ledger.hasRoom(0))
        ledger.queued(0)
        #expect(ledger.hasRoom(0) && ledger.sending == 1)
        ledger.admitted(0)
        ledger.queued(0)
        ledger.admitted(0)
        #expect(!ledger.hasRoom(0), "two waiting: the bound")
        ledger.dequeued(0)
        #expect(!ledger.hasRoom(0), "two sending again")
    }

    @Test func aFullBacklogPausesUntilItIsDownToHalf() {
        var ledger = LaneLedger(weights: [2, 1], maxInFlight: 10, maxWaiting: 10, backlogLimit: 100)
        let answers = [ledger.consumed(1, records: 99), ledger.consumed(1, records: 1), ledger.consumed(1, records: 500),
                       ledger.taken(1, records: 500), ledger.taken(1, records: 50)]
        // Full at 100; already full at 600; 100 left is not half yet; 50 is.
        #expect(answers == [false, true, false, false, true])
        #expect(!ledger.full[1])
        // One lane never pauses: its reader waits instead.
        var single = LaneLedger(weights: [1], maxInFlight: 10, maxWaiting: 10, backlogLimit: 100)
        let paused = single.consumed(0, records: 1000)
        #expect(!paused)
    }
}
