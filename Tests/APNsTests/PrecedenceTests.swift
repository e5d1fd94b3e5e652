import APNs
@testable import HTTP2
import Foundation
import Testing
import TestSupport

/// ``APNsNotification/precedence``: among sends waiting for a stream, a higher one starts first.
@Suite("Send precedence", .timeLimit(.minutes(1)))
struct PrecedenceTests {
    @Test func aHigherPrecedenceSendStartsBeforeTheOnesWaitingAheadOfIt() async throws {
        // One stream, 100 ms per answer: the low sends go out one at a time, for 6 s (a loaded
        // CI run had answered 15 of 30 before the urgent send came).
        let harness = try await Harness.start {
            $0.maxConcurrentStreams = 1
            $0.behaviour.latency = .milliseconds(100)
        }
        let low = 60
        // In the order the sends finished.
        let (answeredBefore, order) = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<low {
                group.addTask {
                    _ = try await harness.client.send(.alert("x", deviceToken: token(index), topic: sampleTopic))
                    return "low-\(index)"
                }
            }
            // The first low send was answered: the others wait for the stream.
            try #require(await harness.simulator.waitForAnswers(atLeast: 1, within: .seconds(20)))
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

/// ``PrecedenceQueue`` by itself: higher precedence first, order within a level, and no level
/// starved while a higher one keeps coming.
@Suite("Precedence queue")
struct PrecedenceQueueTests {
    @Test func higherFirstInOrderAndEveryEighthStartGoesToTheOldest() {
        var queue = PrecedenceQueue<String>()
        for index in 0..<10 { queue.append("low-\(index)", precedence: 0) }
        for index in 0..<20 { queue.append("high-\(index)", precedence: 2) }
        queue.append("beyond", precedence: 9)
        var order: [String] = []
        while let next = queue.popFirst() { order.append(next) }
        #expect(queue.isEmpty && queue.count == 0)
        #expect(order.count == 31)
        // Highest first; each eighth start is the oldest waiting (a low one, in its order).
        #expect(Array(order.prefix(9)) == ["beyond"] + (0..<6).map { "high-\($0)" } + ["low-0", "high-6"], "\(order)")
        #expect(order.filter { $0.hasPrefix("low-") } == (0..<10).map { "low-\($0)" })
        #expect(order.filter { $0.hasPrefix("high-") } == (0..<20).map { "high-\($0)" })
        #expect(order.firstIndex(of: "low-1") == 15 && order.firstIndex(of: "low-2") == 23, "\(order)")
    }

    /// A high level that never empties still lets the low one through: one start in eight.
    @Test func aBusyHighLevelDoesNotStarveALowOne() {
        var queue = PrecedenceQueue<Int>()
        for index in 0..<100 { queue.append(-index - 1, precedence: 0) }
        var lowStarts = 0
        for index in 0..<800 {
            queue.append(index, precedence: 3)
            if let next = queue.popFirst(), next < 0 { lowStarts += 1 }
        }
        #expect(lowStarts == 100)
    }

    @Test func filterKeepsOrderAndCount() {
        var queue = PrecedenceQueue<Int>()
        for index in 0..<10 { queue.append(index, precedence: index % 2) }
        queue.filter { $0 % 3 != 0 }
        #expect(queue.count == 6 && queue.contains { $0 == 4 } && !queue.contains { $0 == 3 })
        var order: [Int] = []
        while let next = queue.popFirst() { order.append(next) }
        #expect(order == [1, 5, 7, 2, 4, 8])
    }
}
