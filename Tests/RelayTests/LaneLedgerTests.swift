import Kafka
import NIOCore
@testable import Relay
import Testing

/// ``LaneLedger``: weighted shares of in-flight capacity, and who goes on when a slot frees.
@Suite("Lane ledger", .timeLimit(.minutes(1)))
struct LaneLedgerTests {
    @Test func aLaneAloneMayUseEverything() {
        var ledger = LaneLedger<String>(weights: [8, 1], maxInFlight: 90, maxWaiting: 10)
        ledger.consumed(1, records: 500)
        for _ in 0..<89 { ledger.admitted(1) }
        #expect(ledger.hasRoom(1))
        ledger.admitted(1)
        #expect(!ledger.hasRoom(1) && !ledger.hasRoom(0))
    }

    @Test func whileAnotherLanePressesEachGetsItsWeightedShare() {
        var ledger = LaneLedger<String>(weights: [8, 1], maxInFlight: 90, maxWaiting: 10)
        ledger.consumed(1, records: 500)
        for _ in 0..<90 { ledger.admitted(1) }
        // The urgent lane gets work: the bulk lane is far above its share of 10.
        ledger.consumed(0, records: 50)
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
        ledger.taken(0, records: 50)
        #expect(ledger.share(1) == 90)
    }

    @Test func waitingIntentsTakeNoSendSlotButAreBounded() {
        var ledger = LaneLedger<String>(weights: [1], maxInFlight: 2, maxWaiting: 2)
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

    /// A bulk lane whose intents wait behind their devices cannot take every waiting place:
    /// while the urgent lane presses, each lane may have its weighted share of `maxWaiting`
    /// waiting.
    @Test func waitingPlacesAreSharedByWeightToo() {
        var ledger = LaneLedger<String>(weights: [8, 1], maxInFlight: 1000, maxWaiting: 90)
        ledger.consumed(1, records: 5000)
        // Alone, the bulk lane takes every waiting place.
        for _ in 0..<90 {
            #expect(ledger.hasRoom(1))
            ledger.admitted(1)
            ledger.queued(1)
        }
        #expect(!ledger.hasRoom(1) && ledger.totalWaiting == 90)
        // Urgent intents come: the urgent lane has its 80 places though all 90 are taken.
        ledger.consumed(0, records: 100)
        #expect(ledger.share(0, of: 90) == 80 && ledger.share(1, of: 90) == 10)
        for _ in 0..<80 {
            #expect(ledger.hasRoom(0))
            ledger.admitted(0)
            ledger.queued(0)
        }
        #expect(!ledger.hasRoom(0) && !ledger.hasRoom(1), "each at its share: \(ledger.waiting)")
        // The bulk lane drains to its share of 10 before it may queue again.
        for _ in 0..<80 { ledger.dequeued(1) }
        #expect(!ledger.hasRoom(1))
        ledger.dequeued(1)
        #expect(ledger.hasRoom(1))
    }

    /// Lanes that take every waiting place in turn (each alone while it fills up) stop at twice
    /// `maxWaiting` in all.
    @Test func waitingIntentsNeverPassTwiceTheLimit() {
        var ledger = LaneLedger<String>(weights: [1, 8, 8], maxInFlight: 1000, maxWaiting: 10)
        for lane in 0..<3 {
            ledger.consumed(lane, records: 100)
            while ledger.hasRoom(lane) {
                ledger.admitted(lane)
                ledger.queued(lane)
            }
            ledger.taken(lane, records: 100)
        }
        #expect(ledger.totalWaiting == 20, "\(ledger.waiting)")
    }

    @Test func aFreedSlotWakesOneWaitingLaneNotAll() {
        var ledger = LaneLedger<String>(weights: [1, 1, 1], maxInFlight: 6, maxWaiting: 10)
        for lane in 0..<3 { ledger.consumed(lane, records: 10) }
        for _ in 0..<6 { ledger.admitted(0) }
        ledger.wait(1, "lane 1")
        ledger.wait(2, "lane 2")
        #expect(ledger.waitersWithRoom().isEmpty)
        // One slot frees: lanes 1 and 2 are both below their share, one of them goes on.
        ledger.finished(0)
        #expect(ledger.waitersWithRoom() == ["lane 1"])
        ledger.admitted(1)
        ledger.finished(0)
        #expect(ledger.waitersWithRoom() == ["lane 2"])
    }

    @Test func theBacklogPressesUntilItIsTaken() {
        var ledger = LaneLedger<String>(weights: [2, 1], maxInFlight: 10, maxWaiting: 10)
        ledger.consumed(1, records: 99)
        #expect(ledger.presses(1) && !ledger.presses(0))
        ledger.taken(1, records: 500)
        #expect(!ledger.presses(1) && ledger.backlog[1] == 0)
    }
}

/// Where an urgent intent stands in its device's queue (``DeviceQueues/position(of:in:precedence:)``).
@Suite("Device queue order across lanes")
struct DeviceQueueOrderTests {
    static let intent = Intent(id: "i", token: String(repeating: "a", count: 64), topic: "com.x", pushType: .alert, priority: 10,
                               expiration: 0, collapseID: nil, environment: .production, payload: ByteBuffer(string: "{}"))

    static func item(lane: Int, _ admission: RelayPipeline.Admission = .send, mailbox: Bool = false) -> RelayPipeline.WorkItem {
        RelayPipeline.WorkItem(partition: TopicPartition(topic: "t\(lane)", partition: 0), lane: lane, offset: 0, generation: 0,
                               consumedAt: .now, intent: .success(intent), admission: admission,
                               mailboxMember: mailbox ? "member" : nil)
    }

    /// Lane 0 is urgent (precedence 1), lane 1 bulk (0). The answer is the index the urgent
    /// send takes, nil for the end.
    static func position(_ lanes: [RelayPipeline.WorkItem]) -> Int? {
        let queue = CircularBuffer(lanes)
        return DeviceQueues<RelayPipeline.WorkItem>.position(of: item(lane: 0), in: queue, precedence: [1, 0])
            .map { queue.distance(from: queue.startIndex, to: $0) }
    }

    @Test func anUrgentSendGoesBehindTheRunningOneAndAheadOfBulkSends() {
        #expect(Self.position([Self.item(lane: 1)]) == nil, "only the running one: behind it")
        #expect(Self.position([Self.item(lane: 1), Self.item(lane: 1), Self.item(lane: 1)]) == 1)
        #expect(Self.position([Self.item(lane: 1), Self.item(lane: 0), Self.item(lane: 1)]) == 2, "behind urgent ones")
        #expect(Self.position([Self.item(lane: 0), Self.item(lane: 0)]) == nil)
    }

    /// Not ahead of an intent to park (it would park after the urgent one and displace it), nor
    /// of a mailbox delivery.
    @Test func notAheadOfAParkOrAMailboxDelivery() {
        #expect(Self.position([Self.item(lane: 1), Self.item(lane: 1, .park(due: 1)), Self.item(lane: 1), Self.item(lane: 1)]) == 2, "right behind the park")
        #expect(Self.position([Self.item(lane: 1), Self.item(lane: 1), Self.item(lane: 1, mailbox: true)]) == nil)
    }
}
