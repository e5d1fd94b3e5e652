import Common
import Foundation
import Redis
import Synchronization

/// Records which intents APNs already answered (see ``DevicePolicy`` for the key and for the
/// check, which is part of every batch's admission).
///
/// An intent is recorded once APNs gave a final answer for it (delivered, rejected or
/// unregistered) and before its outcome is published; an intent seen in Redis is not sent again
/// and gets the outcome `duplicate`. So a redelivery after a rebalance or a restart comes out
/// `duplicate`, and only a crash between APNs answering and Redis recording can send an intent
/// twice: at most the intents in flight at the crash. Intents that ended `failed` or `expired`
/// are not recorded: publishing the same intent again tries again.
final class Deduplicator: Sendable {
    private let recorder: GroupCommit

    init(client: RedisClient) {
        self.recorder = GroupCommit(client: client)
    }

    /// Records an answered intent for `window` seconds (and, when APNs accepted it, the
    /// device's last notification); concurrent records share round trips.
    func record(token: String, topic: String, id: String, status: String, window: Int64,
                lastSent: DeviceRecords.LastSent?) async throws(RedisError) {
        var seen = RedisCommand("SET", reservingBytes: 64 + token.utf8.count + topic.utf8.count + id.utf8.count, arguments: 4)
        seen.appendArgument { DevicePolicy.writeSeenKey(&$0, token: token, topic: topic, id: id) }
        seen.append(status)
        seen.append("EX")
        seen.append(window)
        guard let lastSent else { return try await recorder.submit(seen) }
        var last = RedisCommand("SET", reservingBytes: 64 + token.utf8.count + topic.utf8.count + lastSent.json.count, arguments: 4)
        last.appendArgument { DeviceRecords.writeLastSentKey(&$0, token: lastSent.token, topic: lastSent.topic) }
        last.append(lastSent.json)
        last.append("EX")
        last.append(DeviceRecords.lastSentTTL)
        try await recorder.submit(seen, last)
    }
}

/// Sends the commands submitted while a round trip is under way together in the next one, so
/// that many concurrent writers cost few round trips. The queue is bounded by its callers: each
/// waits for its own submission (the pipeline has at most `limits.max_in_flight` intents).
final class GroupCommit: Sendable {
    private struct State {
        /// Commands with the submitter waiting for them (resumed once per submission).
        var queued: [(RedisCommand, CheckedContinuation<Result<Void, RedisError>, Never>?)] = []
        var flushing = false
    }

    private let client: RedisClient
    private let state = Mutex(State())
    /// Commands per round trip at most.
    private let maxBatch = 1000

    init(client: RedisClient) {
        self.client = client
    }

    /// Sends the commands in the next round trip (together); fails when any of them failed.
    func submit(_ first: RedisCommand, _ second: RedisCommand? = nil) async throws(RedisError) {
        let result = await withCheckedContinuation { continuation in
            let startFlush = state.withLock { state -> Bool in
                // The submitter hears once, with its last command, after all of them ran.
                if let second {
                    state.queued.append((first, nil))
                    state.queued.append((second, continuation))
                } else {
                    state.queued.append((first, continuation))
                }
                guard !state.flushing else { return false }
                state.flushing = true
                return true
            }
            if startFlush {
                Task { await self.flush() }
            }
        }
        try result.get()
    }

    private func flush() async {
        while true {
            let batch = state.withLock { state -> [(RedisCommand, CheckedContinuation<Result<Void, RedisError>, Never>?)] in
                // Never split one submission over two round trips.
                var count = min(state.queued.count, maxBatch)
                while count < state.queued.count, state.queued[count - 1].1 == nil { count += 1 }
                let taken = Array(state.queued.prefix(count))
                state.queued.removeFirst(taken.count)
                if taken.isEmpty { state.flushing = false }
                return taken
            }
            guard !batch.isEmpty else { return }
            do {
                let replies = try await client.pipeline(batch.map(\.0))
                var failure: RedisError?
                for (reply, (_, continuation)) in zip(replies, batch) {
                    if case .error(let message) = reply { failure = .server(message) }
                    guard let continuation else { continue }
                    continuation.resume(returning: failure.map { .failure($0) } ?? .success(()))
                    failure = nil
                }
            } catch {
                for case (_, let continuation?) in batch { continuation.resume(returning: .failure(error)) }
            }
        }
    }
}
