import Redis
@testable import Relay
import Testing

/// The rounds of a group commit (``GroupCommitRounds``), without Redis: which submissions share
/// a round trip, how many are under way, and who hears what of a round's replies.
@Suite("Group commit rounds")
struct GroupCommitRoundsTests {
    /// `count` SETs, one command each.
    static func sets(_ count: Int) -> (inout RedisCommandBuffer) -> Void {
        { buffer in for index in 0..<count { buffer.append(RedisCommand("SET", ["k\(index)", "v"])) } }
    }

    /// Submissions made while the senders are busy wait in the round being filled; a round
    /// holds whole submissions, a new one starting once it reached its size.
    @Test func submissionsShareRoundsUpToTheirSize() {
        var rounds = GroupCommitRounds<String>(maxBatch: 3, maxFlushers: 2)
        let startsFirst = rounds.submit(Self.sets(1), for: "a")
        #expect(startsFirst, "the first submission starts a sender")
        let startsSecond = rounds.submit(Self.sets(1), for: "b")
        #expect(startsSecond, "a second sender, up to two")
        let startsThird = rounds.submit(Self.sets(2), for: "c")
        #expect(!startsThird, "no third")
        let startsFourth = rounds.submit(Self.sets(2), for: "d")
        #expect(!startsFourth)
        #expect(rounds.waitingRounds == 2)
        let first = rounds.next()
        #expect(first?.commands.count == 4, "a, b and c (never split), then full")
        #expect(first?.waiters.map { $0.end } == [1, 2, 4])
        #expect(first?.waiters.map { $0.waiter } == ["a", "b", "c"])
        let second = rounds.next()
        #expect(second?.waiters.map { $0.waiter } == ["d"])
        let none = rounds.next()
        #expect(none == nil && rounds.flushers == 1, "a sender with nothing left stops")
        let noneAgain = rounds.next()
        #expect(noneAgain == nil && rounds.flushers == 0)
        let startsAgain = rounds.submit(Self.sets(1), for: "e")
        #expect(startsAgain, "a sender starts again")
    }

    /// Each submitter hears the first error reply among its own commands, or success; a round
    /// trip that failed, or replies that do not match, fail everyone in the round.
    @Test func aRoundsRepliesAreSplitAmongItsSubmitters() throws {
        var rounds = GroupCommitRounds<String>(maxBatch: 100, maxFlushers: 1)
        _ = rounds.submit(Self.sets(2), for: "a")
        _ = rounds.submit(Self.sets(1), for: "b")
        _ = rounds.submit(Self.sets(2), for: "c")
        let next = rounds.next()
        let round = try #require(next)
        let answers = GroupCommitRounds.answers(round, .success([.status("OK"), .status("OK"), .error("OOM full"),
                                                                  .status("OK"), .error("READONLY replica")]))
        #expect(answers.map(\.0) == ["a", "b", "c"])
        let errors = answers.map { answer -> RedisError? in if case .failure(let error) = answer.1 { error } else { nil } }
        #expect(errors == [nil, .server("OOM full"), .server("READONLY replica")])
        let lost = GroupCommitRounds.answers(round, .failure(.connectionLost("reset")))
        #expect(lost.allSatisfy { if case .failure(.connectionLost) = $0.1 { true } else { false } })
        let short = GroupCommitRounds.answers(round, .success([.status("OK")]))
        #expect(short.allSatisfy { if case .failure(.protocolError("1 replies to 5 commands")) = $0.1 { true } else { false } })
    }
}
