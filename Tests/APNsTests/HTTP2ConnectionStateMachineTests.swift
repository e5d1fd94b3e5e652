import HTTP2
import NIOCore
import Testing

/// The HTTP/2 client connection's rules step by step, on a made-up clock.
@Suite("HTTP/2 connection state machine", .timeLimit(.minutes(3)))
struct HTTP2ConnectionStateMachineTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    func machine(cap: Int = 1000) -> HTTP2ConnectionStateMachine {
        HTTP2ConnectionStateMachine(
            configuration: .init(maxConcurrentStreams: cap, idlePingInterval: .seconds(60), pingTimeout: .seconds(10),
                                 readyTimeout: .seconds(10)),
            now: start)
    }

    @Test func requestsQueueUntilTheFirstSettingsThenFlowUpToTheServersLimit() {
        var machine = machine()
        #expect(machine.phase == .starting)
        #expect(machine.isAcceptingRequests)
        #expect(machine.streamLimit == 1)
        #expect(machine.streamsToStart(open: 0, pending: 5) == 0)

        let change3 = machine.settingsReceived(maxConcurrentStreams: 3)
        #expect(change3 == .init(becameReady: true, streamLimit: 3))
        #expect(machine.phase == .open)
        #expect(machine.streamsToStart(open: 0, pending: 5) == 3)
        #expect(machine.streamsToStart(open: 2, pending: 5) == 1)
        #expect(machine.streamsToStart(open: 3, pending: 5) == 0)
        #expect(machine.streamsToStart(open: 1, pending: 1) == 1)
    }

    @Test func ourCapBoundsTheServersLimitAndOnlyRealChangesAreReported() {
        var machine = machine(cap: 100)
        let change1000 = machine.settingsReceived(maxConcurrentStreams: 1000)
        #expect(change1000 == .init(becameReady: true, streamLimit: 100))
        // A larger advertisement does not change the capped limit: nothing to report.
        let change2000 = machine.settingsReceived(maxConcurrentStreams: 2000)
        #expect(change2000 == .init(becameReady: false, streamLimit: nil))
        let change10 = machine.settingsReceived(maxConcurrentStreams: 10)
        #expect(change10 == .init(becameReady: false, streamLimit: 10))
        // The server may lower the limit below the streams already open: none start until they end.
        #expect(machine.streamsToStart(open: 50, pending: 5) == 0)
        let change0 = machine.settingsReceived(maxConcurrentStreams: 0)
        #expect(change0 == .init(becameReady: false, streamLimit: 0))
        #expect(machine.streamsToStart(open: 0, pending: 5) == 0)
    }

    @Test func goAwayStopsNewStreamsAndRefusesStreamsAboveItsLastStreamID() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        machine.goAwayReceived(lastStreamID: 7)
        #expect(machine.phase == .goingAway)
        #expect(!machine.isAcceptingRequests)
        #expect(machine.streamsToStart(open: 0, pending: 5) == 0)
        // A second GOAWAY may lower the last stream id, never raise it.
        machine.goAwayReceived(lastStreamID: 9)
        #expect(machine.goAwayLastStreamID == 7)
        machine.goAwayReceived(lastStreamID: 5)
        #expect(machine.goAwayLastStreamID == 5)

        // Processed (at or below 5): a reset stays a reset; above it: refused, safe to send again.
        #expect(machine.streamClosed(5, errorCode: 2, complete: false, headersSent: true, deadlinePassed: false)
            == .failure(.reset(2)))
        #expect(machine.streamClosed(7, errorCode: 2, complete: false, headersSent: true, deadlinePassed: false)
            == .failure(.refused("not processed")))
        // A complete response is a response whatever the GOAWAY said.
        #expect(machine.streamClosed(7, errorCode: 0, complete: true, headersSent: true, deadlinePassed: false) == .response)

        #expect(!machine.shouldClose(openStreams: 1, sessionAlive: true))
        #expect(machine.shouldClose(openStreams: 0, sessionAlive: true))
        #expect(machine.shouldClose(openStreams: 3, sessionAlive: false))
    }

    @Test func howAStreamThatClosedEnds() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        #expect(machine.streamClosed(1, errorCode: HTTP2ErrorCode.refusedStream, complete: false, headersSent: true,
                                     deadlinePassed: false) == .failure(.refused("REFUSED_STREAM")))
        #expect(machine.streamClosed(1, errorCode: 8, complete: false, headersSent: false, deadlinePassed: false)
            == .failure(.refused("not processed")))
        #expect(machine.streamClosed(1, errorCode: 8, complete: false, headersSent: true, deadlinePassed: true)
            == .failure(.timedOut))
        #expect(machine.streamClosed(1, errorCode: 8, complete: false, headersSent: true, deadlinePassed: false)
            == .failure(.reset(8)))
    }

    @Test func aShutdownSendsGoAwayOnceAndClosesWhenTheLastStreamEnds() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        #expect(!machine.shouldClose(openStreams: 0, sessionAlive: true))
        let shutdown1 = machine.shutdownRequested()
        #expect(shutdown1)
        let shutdown2 = machine.shutdownRequested()
        #expect(!shutdown2)
        #expect(machine.phase == .goingAway)
        #expect(!machine.shouldClose(openStreams: 2, sessionAlive: true))
        #expect(machine.shouldClose(openStreams: 0, sessionAlive: true))

        let ended1 = machine.connectionEnded()
        #expect(ended1)
        let ended2 = machine.connectionEnded()
        #expect(!ended2)
        let shutdown3 = machine.shutdownRequested()
        #expect(!shutdown3)
        #expect(machine.phase == .closed)
    }

    @Test func streamsOpenWhenTheConnectionEndsAreRefusedOrLost() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        machine.goAwayReceived(lastStreamID: 3)
        let ended1 = machine.connectionEnded()
        #expect(ended1)
        #expect(machine.streamAtConnectionEnd(3, complete: false, headersSent: true, why: "eof") == .failure(.connectionLost("eof")))
        #expect(machine.streamAtConnectionEnd(5, complete: false, headersSent: true, why: "eof") == .failure(.refused("eof")))
        #expect(machine.streamAtConnectionEnd(1, complete: false, headersSent: false, why: "eof") == .failure(.refused("eof")))
        #expect(machine.streamAtConnectionEnd(1, complete: true, headersSent: true, why: "eof") == .response)
        let tick1 = machine.timerFired(now: start + .seconds(3600))
        #expect(tick1 == .none)
    }

    @Test func theFirstSettingsMustArriveBeforeTheReadyTimeout() {
        var machine = machine()
        let tick1 = machine.timerFired(now: start + .seconds(10))
        #expect(tick1 == .none)
        // A frame that is not SETTINGS still counts as a sign of life.
        machine.frameReceived(now: start + .seconds(5))
        let tick2 = machine.timerFired(now: start + .seconds(15))
        #expect(tick2 == .none)
        let tick3 = machine.timerFired(now: start + .seconds(15) + .milliseconds(1))
        #expect(tick3 == .fail(.connectTimeout))
    }

    @Test func anIdleConnectionIsPingedAndClosedWhenThePingGoesUnanswered() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        machine.frameReceived(now: start)
        let tick1 = machine.timerFired(now: start + .seconds(60))
        #expect(tick1 == .none)
        let tick2 = machine.timerFired(now: start + .seconds(61))
        #expect(tick2 == .sendPing)
        // One PING at a time.
        let tick3 = machine.timerFired(now: start + .seconds(65))
        #expect(tick3 == .none)
        let tick4 = machine.timerFired(now: start + .seconds(71))
        #expect(tick4 == .none)
        let tick5 = machine.timerFired(now: start + .seconds(71) + .milliseconds(1))
        #expect(tick5 == .fail(.pingTimeout))
    }

    @Test func anAnsweredPingOrAnyFrameRestartsTheIdleClock() {
        var machine = machine()
        _ = machine.settingsReceived(maxConcurrentStreams: 10)
        machine.frameReceived(now: start)
        let tick1 = machine.timerFired(now: start + .seconds(61))
        #expect(tick1 == .sendPing)
        machine.pingAcknowledged()
        machine.frameReceived(now: start + .seconds(62))
        let tick2 = machine.timerFired(now: start + .seconds(100))
        #expect(tick2 == .none)
        let tick3 = machine.timerFired(now: start + .seconds(123))
        #expect(tick3 == .sendPing)
        machine.frameReceived(now: start + .seconds(124))
        let tick4 = machine.timerFired(now: start + .seconds(140))
        #expect(tick4 == .none)
        // A connection going away is kept honest by PINGs too.
        machine.goAwayReceived(lastStreamID: 1)
        let tick5 = machine.timerFired(now: start + .seconds(185))
        #expect(tick5 == .sendPing)
    }
}
