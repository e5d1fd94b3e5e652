import Common
import Foundation
import NIOCore
import Redis
import Synchronization

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

    /// `loops`: the event loops records are made on (the shards').
    init(client: RedisClient, keys: RedisKeys, loops: [any EventLoop]) {
        self.recorder = GroupCommit(client: client, loops: loops)
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
    func record(token: String, topic: String, id: String, status: AnswerRecord, window: Int64,
                lastSent: DeviceRecords.LastSent?, unregistered: Unregistered? = nil, onlyIfAbsent: Bool = false,
                then done: @escaping @Sendable (Result<Void, RedisError>) -> Void) {
        recorder.submit({ buffer in
            buffer.append("SET") { command in
                command.appendArgument { keys.writeSeen(&$0, token: token, topic: topic, id: id) }
                command.appendArgument { status.write(into: &$0) }
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
    func record(token: String, topic: String, id: String, status: AnswerRecord, window: Int64,
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
///
/// One set of rounds per event loop the relay's shards run on (``GroupCommitRounds``), confined
/// to it (no lock): a record is submitted on its item's shard's loop, and a round goes out once
/// the tasks queued on the loop when it began have run (`execute`: what they submit joins it),
/// or as soon as an earlier round's replies are in while two are under way; no task sends it.
/// Its replies are handed back to that loop, where the submitters hear their answers (each
/// hands an outcome to the producer, or ends its item) next to the rest of their items' steps;
/// not on the Redis client's loop, whose next replies they would hold up (docs/performance.md,
/// "Redis calls without a task each"). A submission made off the loops (the mailbox poll's) is
/// encoded where it is made and joins the first loop's rounds.
final class GroupCommit: Sendable {
    typealias Done = @Sendable (Result<Void, RedisError>) -> Void

    private let client: RedisClient
    /// Per loop, its rounds: up to 1,000 commands per round trip (one submission is never
    /// split). Two round trips under way at once keep Redis busy while the loop hands one
    /// round's answers on (one made them take turns; four measured no better than two);
    /// commands queue into the round being filled while both are under way.
    private let loops: [(loop: any EventLoop, rounds: NIOLoopBoundBox<GroupCommitRounds<Done>>)]
    /// Round trips sent so far (tests).
    private let sent = Atomic<Int>(0)

    /// `loops`: the shards' event loops (each once).
    init(client: RedisClient, loops: [any EventLoop]) {
        self.client = client
        self.loops = loops.map { ($0, .makeBoxSendingValue(GroupCommitRounds(maxBatch: 1000, maxFlushers: 2), eventLoop: $0)) }
    }

    /// Round trips sent so far.
    var roundTrips: Int { sent.load(ordering: .relaxed) }

    /// Sends the commands `encode` adds in the next round trip of the calling loop (together);
    /// `done` hears, on that loop, whether all of them succeeded. Off the loops, the next of the
    /// first loop's.
    func submit(_ encode: (inout RedisCommandBuffer) -> Void, then done: @escaping Done) {
        if let index = loops.firstIndex(where: { $0.loop.inEventLoop }) { return submit(on: index, encode, done) }
        var commands = RedisCommandBuffer(reservingBytes: 512)
        encode(&commands)
        let encoded = commands
        loops[0].loop.execute { self.submit(on: 0, { $0.append(contentsOf: encoded) }, done) }
    }

    /// ``submit(_:then:)`` on loop `index`.
    private func submit(on index: Int, _ encode: (inout RedisCommandBuffer) -> Void, _ done: @escaping Done) {
        let (loop, rounds) = loops[index]
        if rounds.withValue({ $0.submit(encode, for: done) }) { loop.execute { self.flush(index) } }
    }

    /// Sends loop `index`'s next round, and once its replies are in, the one after (until none
    /// is left: then this sender stops).
    private func flush(_ index: Int) {
        let (loop, rounds) = loops[index]
        guard let round = rounds.withValue({ $0.next() }) else { return }
        sent.add(1, ordering: .relaxed)
        client.submit(round.commands, ordered: false).whenComplete(on: loop) { replies in
            for (done, answer) in GroupCommitRounds.answers(round, replies) { done(answer) }
            self.flush(index)
        }
    }
}

/// The rounds of a ``GroupCommit``, as a pure state machine: a submission joins the round being
/// filled (a new one once that holds `maxBatch` commands; a submission is never split), at most
/// `maxFlushers` round trips are under way, and a round's replies are split among its
/// submitters. No I/O: ``GroupCommit`` sends the rounds.
struct GroupCommitRounds<Waiter> {
    /// One round trip's commands, and who waits for which: each submitter hears once, after its
    /// last command, whether all of its commands succeeded.
    struct Round {
        var commands = RedisCommandBuffer(reservingBytes: 16 * 1024)
        /// (count of commands up to and including the submitter's, the submitter)
        var waiters: [(end: Int, waiter: Waiter)] = []
    }

    let maxBatch: Int
    let maxFlushers: Int
    private var rounds: [Round] = []
    /// Senders under way, each sending one round at a time.
    private(set) var flushers = 0

    init(maxBatch: Int, maxFlushers: Int) {
        self.maxBatch = maxBatch
        self.maxFlushers = maxFlushers
    }

    /// Rounds waiting to be sent.
    var waitingRounds: Int { rounds.count }

    /// Adds the commands `encode` writes, for `waiter`. True when a sender starts for them (it
    /// then asks ``next()`` until that says there is nothing left).
    mutating func submit(_ encode: (inout RedisCommandBuffer) -> Void, for waiter: Waiter) -> Bool {
        if rounds.isEmpty || rounds[rounds.count - 1].commands.count >= maxBatch {
            rounds.append(Round())
        }
        let last = rounds.count - 1
        encode(&rounds[last].commands)
        rounds[last].waiters.append((rounds[last].commands.count, waiter))
        guard flushers < maxFlushers else { return false }
        flushers += 1
        return true
    }

    /// The next round for a sender; nil when none waits, and that sender stops.
    mutating func next() -> Round? {
        guard !rounds.isEmpty else {
            flushers -= 1
            return nil
        }
        return rounds.removeFirst()
    }

    /// Each waiter's answer, from its round's replies: the first error reply among its commands,
    /// else success. When the round trip failed, or its replies do not match its commands,
    /// every waiter fails.
    static func answers(_ round: Round, _ replies: Result<[RESPValue], RedisError>) -> [(Waiter, Result<Void, RedisError>)] {
        let got: [RESPValue]
        switch replies {
        case .success(let values) where values.count == round.commands.count:
            got = values
        case .success(let values):
            let error = RedisError.protocolError("\(values.count) replies to \(round.commands.count) commands")
            return round.waiters.map { ($0.waiter, .failure(error)) }
        case .failure(let error):
            return round.waiters.map { ($0.waiter, .failure(error)) }
        }
        var start = 0
        return round.waiters.map { end, waiter in
            defer { start = end }
            let failure = got[start..<end].lazy.compactMap { reply -> RedisError? in
                if case .error(let message) = reply { return .server(message) }
                return nil
            }.first
            return (waiter, failure.map { .failure($0) } ?? .success(()))
        }
    }
}

extension GroupCommitRounds: Sendable where Waiter: Sendable {}
extension GroupCommitRounds.Round: Sendable where Waiter: Sendable {}
