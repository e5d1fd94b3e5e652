import Common
import Foundation
import NIOCore
import NIOPosix
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// The dedupe records' group commit against a real `redis-server`: its rounds are its loops',
/// with no task, and its submitters hear their answers on the loop they submitted on.
@Suite("Group commit on the shards' loops")
struct GroupCommitTests {
    /// Records submitted in one turn of a loop go out in one round trip, at the end of that
    /// turn, and every submitter hears its answer on that loop; a submission made off the loops
    /// goes in the first loop's next round and is heard there.
    @Test func aLoopsTurnSendsOneRoundAndHearsItsAnswersThere() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try TestRedis(redis).client()
        let loops = [MultiThreadedEventLoopGroup.singleton.next()]
        let commit = GroupCommit(client: client, loops: loops)
        let heard = Locked<[(ok: Bool, onLoop: Bool)]>([])
        let count = 100
        try await loops[0].submit {
            for index in 0..<count {
                commit.submit({ $0.append(RedisCommand("SET", ["group-commit-\(index)", "v"])) }) { result in
                    heard.withLock { $0.append((result.isSuccess, loops[0].inEventLoop)) }
                }
            }
        }.get()
        try await waitUntil(timeout: .seconds(30)) { heard.withLock { $0.count } == count }
        #expect(commit.roundTrips == 1, "one round for the turn's \(count) submissions")
        #expect(heard.withLock { $0.allSatisfy { $0.ok && $0.onLoop } })

        // Off the loops: encoded here, sent from the first loop, heard there.
        let offLoop = Locked<(ok: Bool, onLoop: Bool)?>(nil)
        commit.submit({ $0.append(RedisCommand("SET", ["group-commit-off", "v"])) }) { result in
            offLoop.withLock { $0 = (result.isSuccess, loops[0].inEventLoop) }
        }
        try await waitUntil(timeout: .seconds(30)) { offLoop.withLock { $0 } != nil }
        #expect(offLoop.withLock { $0?.ok == true && $0?.onLoop == true })
        #expect(commit.roundTrips == 2)
        let stored = try await client.send(RedisCommand("MGET", ["group-commit-0", "group-commit-99", "group-commit-off"]))
        #expect(stored.array?.compactMap(\.string) == ["v", "v", "v"])
        await client.shutdown()
    }
}

extension GroupCommitTests {
    /// With two loops, each loop's records go out in that loop's rounds and are heard on it:
    /// a record is never handed to another shard's loop.
    @Test func eachLoopsRecordsAreHeardOnThatLoop() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try TestRedis(redis).client()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let loops = Array(group.makeIterator())
        let commit = GroupCommit(client: client, loops: loops)
        let heard = Locked<[(loop: Int, ok: Bool, onLoop: Bool)]>([])
        for (index, loop) in loops.enumerated() {
            try await loop.submit {
                for record in 0..<10 {
                    commit.submit({ $0.append(RedisCommand("SET", ["group-commit-\(index)-\(record)", "v"])) }) { result in
                        heard.withLock { $0.append((index, result.isSuccess, loop.inEventLoop)) }
                    }
                }
            }.get()
        }
        try await waitUntil(timeout: .seconds(30)) { heard.withLock { $0.count } == 20 }
        #expect(heard.withLock { $0.allSatisfy { $0.ok && $0.onLoop } }, "\(heard.withLock { $0 })")
        #expect(commit.roundTrips == 2, "one round per loop's turn")
        await client.shutdown()
        try await group.shutdownGracefully()
    }
}

private extension Result {
    var isSuccess: Bool {
        if case .success = self { true } else { false }
    }
}
