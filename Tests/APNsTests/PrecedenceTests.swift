import APNs
import Foundation
import Testing
import TestSupport

/// ``APNsNotification/precedence``: among sends waiting for a stream, a higher one starts first.
@Suite("Send precedence", .timeLimit(.minutes(1)))
struct PrecedenceTests {
    @Test func aHigherPrecedenceSendStartsBeforeTheOnesWaitingAheadOfIt() async throws {
        // One stream, 100 ms per answer: the low sends go out one at a time, for 3 s.
        let harness = try await Harness.start {
            $0.maxConcurrentStreams = 1
            $0.behaviour.latency = .milliseconds(100)
        }
        let low = 30
        // In the order the sends finished.
        let (answeredBefore, order) = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<low {
                group.addTask {
                    _ = try await harness.client.send(.alert("x", deviceToken: token(index), topic: sampleTopic))
                    return "low-\(index)"
                }
            }
            // The first low send was answered: the others wait for the stream.
            try await waitUntil { harness.simulator.accepted.count >= 1 }
            let answeredBefore = harness.simulator.accepted.count
            group.addTask {
                var urgent = APNsNotification.alert("x", deviceToken: token(999), topic: sampleTopic)
                urgent.precedence = 1
                _ = try await harness.client.send(urgent)
                return "urgent"
            }
            var order: [String] = []
            for try await label in group { order.append(label) }
            return (answeredBefore, order)
        }
        let position = try #require(order.firstIndex(of: "urgent"))
        // Ahead of the sends that were waiting when it came (without precedence it ends last).
        // Not exactly behind the ones answered by then: on a loaded machine it reaches the
        // connection a few answers later.
        #expect(answeredBefore < low / 2, "the low sends were not waiting any more")
        #expect(position <= answeredBefore + (low - answeredBefore) / 2, "\(answeredBefore) answered before it came: \(order)")
        await harness.stop()
    }
}
