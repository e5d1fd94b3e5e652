import Foundation
import Redis

/// Admission: what Redis holds for a batch's intents (one `MGET` per device and topic), and the
/// decisions taken from it (``DeviceAdmission``, pure) with the device's token bucket.
extension DevicePolicy {
    /// The admission of a batch's groups, asked when ``PendingAdmission/get(now:)`` is called.
    func admission(_ groups: [DeviceAdmission.Group]) -> PendingAdmission {
        PendingAdmission(policy: self, groups: groups)
    }

    /// A batch's admission: one round trip of plain reads for the whole batch (per device and
    /// topic one `MGET` of the bucket, the backoff, the mailbox's ids, the intents' dedupe
    /// records and the pair's remembered 410), the
    /// decisions taken here, and the buckets' new arrival times written after them in a second
    /// round trip on the same connection, whose replies are checked (a group whose write failed
    /// fails as a failed read does).
    ///
    /// Batches are admitted one after another on one connection, so a batch reads what the
    /// batches before it wrote. What this gives up against one script per device: a mailbox
    /// take, or another relay admitting the same device, between one batch's read and its write
    /// is not seen, so one extra send per such overlap can pass the bucket. Intents keyed by
    /// token are consumed by one relay at a time, so that overlap needs a partition handover.
    struct PendingAdmission: Sendable {
        let policy: DevicePolicy
        let groups: [DeviceAdmission.Group]

        /// The decisions for every group at `now` (epoch ms), for each the time the device
        /// may be sent to next, and whether their deliveries delete the pair's remembered 410
        /// (``DeviceAdmission/Decided/forgetsUnregistered``); a group whose read Redis answered with an error (its keys' slot
        /// being migrated in a Redis Cluster, say) has that error instead, and the others are
        /// decided all the same. Throws when the round trip itself failed. Asked again after a
        /// failure, it reads again.
        func get(now: Int64) async throws(RedisError) -> [Result<DeviceAdmission.Decided, RedisError>] {
            guard !groups.isEmpty else { return [] }
            var reads = RedisCommandBuffer(reservingBytes: 256 * groups.count)
            let keys = policy.keys
            for group in groups {
                let token = group.token, topic = group.topic, entries = group.entries
                reads.append("MGET") { command in
                    command.appendArgument { keys.writeRate(&$0, token: token) }
                    command.appendArgument { keys.writeBackoff(&$0, token: token) }
                    command.appendArgument { keys.writeWaiting(&$0, token: token, topic: topic) }
                    for entry in entries { command.appendArgument { keys.writeSeen(&$0, token: token, topic: topic, id: entry.id) } }
                    if group.readsUnregistered { command.appendArgument { keys.writeUnregistered(&$0, token: token, topic: topic) } }
                    if group.rules.mode == .shadow { command.appendArgument { keys.writeShadowWaiting(&$0, token: token, topic: topic) } }
                }
            }
            let replies = try await policy.client.submit(reads, ordered: true).get()
            guard replies.count == groups.count else {
                throw .protocolError("\(replies.count) replies to \(groups.count) admission reads")
            }
            var answers: [Result<DeviceAdmission.Decided, RedisError>] = []
            answers.reserveCapacity(groups.count)
            var writes = RedisCommandBuffer(reservingBytes: 64 * groups.count)
            // Per bucket write, the answer it belongs to.
            var written: [Int] = []
            for (index, group) in groups.enumerated() {
                let stored = replies[index]
                if case .error(let message) = stored {
                    answers.append(.failure(.server(message)))
                    continue
                }
                let shadow = group.rules.mode == .shadow
                guard let values = stored.array,
                      values.count == 3 + group.entries.count + (group.readsUnregistered ? 1 : 0) + (shadow ? 1 : 0) else {
                    throw .protocolError("MGET answered \(stored)")
                }
                var bucket = DeviceAdmission.Bucket(group.rules.rateLimit, stored: values[0].integer, now: now)
                let backoffUntil = DeviceAdmission.Bucket.backoff(values[1].string)?.until ?? 0
                // A value that does not read as a time (Redis holds whatever was written) is
                // no remembered 410: the intent is sent and APNs answers.
                let unregistered = group.readsUnregistered ? values[3 + group.entries.count] : nil
                let unregisteredAt = group.skipsKnownUnregistered ? unregistered?.integer : nil
                // In shadow mode the mailbox enforce mode would have (``DeviceAdmission/ShadowMailbox``), unless
                // the real one holds an intent (parked before a switch to shadow mode).
                let mailbox = values[2].bytes
                let shadowMailbox = shadow && (values[values.count - 1].integer ?? .min) > now ? DeviceAdmission.ShadowMailbox.note : nil
                // Parsed for shadow mode only: enforce mode reads the mailbox as it is.
                let holdsParked = shadow && DeviceAdmission.mailbox(mailbox, holdsFor: "") != .nothing
                let decisions = DeviceAdmission.decide(group, waiting: holdsParked ? mailbox : shadowMailbox ?? mailbox,
                                                    backoffUntil: backoffUntil, bucket: &bucket, now: now,
                                                    unregisteredAt: unregisteredAt) { position in
                    let record = values[3 + position]
                    return record.isNull ? nil : .some(record.string.flatMap(AnswerRecord.init))
                }
                if shadow, !holdsParked,
                   let until = DeviceAdmission.ShadowMailbox.noting(group, decisions, held: shadowMailbox, backoffUntil: backoffUntil, bucket: &bucket) {
                    let token = group.token, topic = group.topic
                    writes.append("SET") { command in
                        command.appendArgument { keys.writeShadowWaiting(&$0, token: token, topic: topic) }
                        command.append(until)
                        command.append("PX")
                        command.append(max(1, until - now) + 60_000)
                    }
                    written.append(answers.count)
                }
                if let arrival = bucket.spent {
                    let token = group.token
                    writes.append("SET") { command in
                        command.appendArgument { keys.writeRate(&$0, token: token) }
                        command.append(arrival)
                        command.append("PX")
                        command.append(arrival - now + 60_000)
                    }
                    written.append(answers.count)
                }
                answers.append(.success(DeviceAdmission.Decided(decisions: decisions, due: max(backoffUntil, bucket.due),
                                                forgetsUnregistered: group.skipsKnownUnregistered || (unregistered.map { !$0.isNull } ?? true))))
            }
            // The buckets are spent before anything is sent: a write Redis refuses (a replica
            // that was a master, `READONLY`; a full `noeviction` server, `OOM`; a slot moved)
            // fails its group as a failed read does, so nothing goes out that the bucket did not
            // count. (Not waiting for them, a Redis that reads but cannot write let every intent
            // through with the rate limit silently off.)
            if !writes.isEmpty {
                let replies = try await policy.client.submit(writes, ordered: true).get()
                guard replies.count == written.count else {
                    throw .protocolError("\(replies.count) replies to \(written.count) bucket writes")
                }
                for (reply, index) in zip(replies, written) {
                    if case .error(let message) = reply { answers[index] = .failure(.server(message)) }
                }
            }
            return answers
        }
    }
}
