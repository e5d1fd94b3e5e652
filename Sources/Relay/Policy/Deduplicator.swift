import Common
import Foundation
import Redis

/// Records which intents APNs already answered (see ``RedisKeys`` for the key and ``DevicePolicy``
/// for the check, which is part of every batch's admission).
///
/// An intent is recorded once APNs gave a final answer for it (delivered, rejected or
/// unregistered), or once a newer intent superseded it (`coalesced`, written only where no
/// record is), and before its outcome is published; an intent seen in Redis is not sent again
/// and gets the outcome `duplicate`. So a redelivery after a rebalance or a restart comes out
/// `duplicate`; docs/outcomes.md ("When APNs can see an intent twice") lists what can still
/// send one twice. Intents that ended `failed` or `expired` are not recorded: publishing the
/// same intent again tries again.
final class Deduplicator: Sendable {
    private let recorder: GroupCommit
    private let keys: RedisKeys

    init(client: RedisClient, keys: RedisKeys) {
        self.recorder = GroupCommit(client: client)
        self.keys = keys
    }

    /// What an answer changes in its pair's remembered 410 (`policy.skip_known_unregistered`).
    enum Unregistered: Sendable, Equatable {
        /// APNs answered 410 with this timestamp (epoch ms): remember it for `ttl` seconds.
        case remember(at: Int64, ttl: Int64)
        /// APNs accepted a notification for the pair: forget any 410.
        case forget
    }

    /// Records an answered intent for `window` seconds (and, when APNs accepted it, the
    /// device's last notification; and `unregistered`'s change); concurrent records share
    /// round trips. `done` hears whether
    /// it was recorded.
    ///
    /// `onlyIfAbsent`: keeps a record already there (`NX`): a `coalesced` answer never replaces
    /// APNs' own.
    func record(token: String, topic: String, id: String, status: String, window: Int64,
                lastSent: DeviceRecords.LastSent?, unregistered: Unregistered? = nil, onlyIfAbsent: Bool = false,
                then done: @escaping @Sendable (Result<Void, RedisError>) -> Void) {
        recorder.submit({ buffer in
            buffer.append("SET") { command in
                command.appendArgument { keys.writeSeen(&$0, token: token, topic: topic, id: id) }
                command.append(status)
                command.append("EX")
                command.append(window)
                if onlyIfAbsent { command.append("NX") }
            }
            switch unregistered {
            case .remember(let at, let ttl)?:
                buffer.append("SET") { command in
                    command.appendArgument { keys.writeUnregistered(&$0, token: token, topic: topic) }
                    command.append(at)
                    command.append("EX")
                    command.append(ttl)
                }
            case .forget?:
                buffer.append("DEL") { command in
                    command.appendArgument { keys.writeUnregistered(&$0, token: token, topic: topic) }
                }
            case nil:
                break
            }
            guard let lastSent else { return }
            buffer.append("SET") { command in
                command.appendArgument { keys.writeLastSent(&$0, token: lastSent.token, topic: lastSent.topic) }
                command.append(lastSent.json)
                command.append("EX")
                command.append(DeviceRecords.lastSentTTL)
            }
        }, then: done)
    }

    /// ``record(token:topic:id:status:window:lastSent:then:)``, waited for.
    func record(token: String, topic: String, id: String, status: String, window: Int64,
                lastSent: DeviceRecords.LastSent?, unregistered: Unregistered? = nil, onlyIfAbsent: Bool = false) async throws(RedisError) {
        let result = await withCheckedContinuation { continuation in
            record(token: token, topic: topic, id: id, status: status, window: window, lastSent: lastSent,
                   unregistered: unregistered, onlyIfAbsent: onlyIfAbsent) {
                continuation.resume(returning: $0)
            }
        }
        try result.get()
    }
}

/// Sends the commands submitted while round trips are under way together in the next one, so
/// that many concurrent writers cost few round trips. Commands are encoded as they are
/// submitted, into the buffer of the next round trip. The queue is bounded by its callers: each
/// waits for its own submission (the pipeline has at most `limits.max_in_flight` intents).
final class GroupCommit: Sendable {
    /// One round trip's commands, and who waits for which: each submitter hears once, after
    /// its last command, whether all of its commands succeeded.
    private struct Round {
        var commands = RedisCommandBuffer(reservingBytes: 16 * 1024)
        /// (count of commands up to and including the submitter's, the submitter)
        var waiters: [(end: Int, done: @Sendable (Result<Void, RedisError>) -> Void)] = []
    }

    private struct State {
        var rounds: [Round] = []
        /// Tasks sending rounds (each one round at a time).
        var flushers = 0
    }

    private let client: RedisClient
    private let state = Locked(State())
    /// Commands per round trip at most (one submission is never split).
    private let maxBatch = 1000
    /// Round trips under way at once. Two keep Redis busy while the relay hands one round's
    /// answers on (one made them take turns; four measured no better than two); commands
    /// queue into the round being filled while both are under way.
    private let maxFlushers = 2

    init(client: RedisClient) {
        self.client = client
    }

    /// Sends the commands `encode` adds in the next round trip (together); `done` hears (from
    /// the task that sent them) whether all of them succeeded.
    func submit(_ encode: (inout RedisCommandBuffer) -> Void, then done: @escaping @Sendable (Result<Void, RedisError>) -> Void) {
        let startFlush = state.withLock { state -> Bool in
            if state.rounds.isEmpty || state.rounds[state.rounds.count - 1].commands.count >= maxBatch {
                state.rounds.append(Round())
            }
            let last = state.rounds.count - 1
            encode(&state.rounds[last].commands)
            state.rounds[last].waiters.append((state.rounds[last].commands.count, done))
            guard state.flushers < maxFlushers else { return false }
            state.flushers += 1
            return true
        }
        if startFlush {
            Task { await self.flush() }
        }
    }

    private func flush() async {
        while true {
            let round = state.withLock { state -> Round? in
                guard !state.rounds.isEmpty else {
                    state.flushers -= 1
                    return nil
                }
                return state.rounds.removeFirst()
            }
            guard let round else { return }
            do throws(RedisError) {
                let replies = try await client.pipeline(round.commands)
                guard replies.count == round.commands.count else {
                    throw .protocolError("\(replies.count) replies to \(round.commands.count) commands")
                }
                var start = 0
                for (end, done) in round.waiters {
                    let failure = replies[start..<end].lazy.compactMap { reply -> RedisError? in
                        if case .error(let message) = reply { return .server(message) }
                        return nil
                    }.first
                    done(failure.map { .failure($0) } ?? .success(()))
                    start = end
                }
            } catch {
                for (_, done) in round.waiters { done(.failure(error)) }
            }
        }
    }
}
