import Common
import APNs
import Kafka
import Logging
import Redis

extension RelayPipeline {
    /// Parks the item's intent in its device's mailbox (the intent it displaces there comes out
    /// `coalesced`; so does this one when the mailbox holds a newer intent of the partition, in
    /// which case nothing is parked). False when it could not (Redis failing with `redis.fail_open`, or the
    /// partition was revoked meanwhile: then the intent is sent, or abandoned, as usual).
    @inline(never)
    func park(_ item: WorkItem, due: Int64, tooManyRequests: Bool = false) async -> Bool {
        guard let policy, case .success(let intent) = item.intent, isActive(item) else { return false }
        var entry = DevicePolicy.Entry(partition: item.partition.partition, offset: item.offset,
                                       consumedAt: APNsIdentifiers.epochMilliseconds() - (ContinuousClock.now - item.consumedAt).totalMilliseconds,
                                       expiration: intent.expiration, message: intent.encoded)
        entry.lane = policy.entryLane(item.partition.topic)
        entry.trace = item.trace.map(Self.storedTrace)
        // While the park is under way (asked again after a failure, say, when its replicas did
        // not acknowledge it in time) this relay's deliverer does not take the entry: a take
        // between two tries would be undone by the second.
        let member = RedisKeys.member(token: intent.recipient, topic: intent.topic, id: intent.id)
        let guarded = mailboxJobs.claim(member)
        defer { if guarded { mailboxJobs.end(member) } }
        // One owner over the tries: a try whose reply was lost leased the displaced entries to it.
        let owner = DevicePolicy.handOverOwner()
        guard let parked = await withRedisRetries(item, { () throws(RedisError) in
            // Each try at its own time: the hand-over leases it grants run from then.
            let now = nowMilliseconds()
            return try await policy.park(token: intent.recipient, topic: intent.topic, id: intent.id, entry: entry,
                                         due: max(due, now), now: now, tooManyRequests: tooManyRequests, owner: owner)
        }) else { return false }
        // A batch whose read began before this park cannot see it: its intents of the mailbox
        // (after a 429, of the device) are decided again (``DeviceQueues/missedPark(_:since:)``).
        await shard(of: item).onLoop { Self.noteParked(intent, tooManyRequests: tooManyRequests, &$0) }
        if parked.keeper == intent.id {
            RelayMetrics.parked.increment()
            logger.debug("parked", metadata: metadata(item, ["relay.due_ms": "\(parked.due - nowMilliseconds())"]))
        }
        await handOver(parked.displaced, unreadable: parked.unreadable, by: parked.keeper, token: intent.recipient,
                       topic: intent.topic, item, policy)
        return true
    }

    /// Publishes `coalesced` for each displaced entry leased to this hand-over and acknowledges
    /// it (it leaves the mailbox); one not published stays, for the next park, take or
    /// redelivery of the device's mailbox to hand over once its lease ends, or for the poll of
    /// its partition then. Entries under another hand-over's lease are that one's. `unreadable`:
    /// the ids of entries no relay can read, moved aside (``quarantine(_:partition:token:topic:_:)``).
    func handOver(_ displaced: [DevicePolicy.Displaced], unreadable: [String] = [], by keeper: String, token: String,
                  topic: String, _ item: WorkItem, _ policy: DevicePolicy) async {
        for id in unreadable {
            _ = await quarantine(id, partition: nil, token: token, topic: topic, policy)
        }
        for entry in displaced where entry.mine {
            guard await publishDisplaced(entry.entry, by: entry.by ?? keeper, item) else { continue }
            do throws(RedisError) {
                try await policy.acknowledgeDisplaced(entry, token: token, topic: topic)
            } catch {
                health.redisFailed(error, by: .mailboxes)
            }
        }
    }

    /// Hands over what a device's mailbox still holds displaced (``handOver(_:unreadable:by:token:topic:_:_:)``):
    /// every path that finds the mailbox does, so that a `coalesced` outcome never waits for a
    /// later park of the device (a relay that died between the park that displaced an entry and
    /// its outcome left it there, under a lease that ends). `keeper`: the intent that holds the
    /// mailbox, when the mailbox does not name one.
    func handOverDisplaced(token: String, topic: String, keeper: String, _ item: WorkItem, _ policy: DevicePolicy) async {
        let found: (holder: String?, entries: [DevicePolicy.Displaced], unreadable: [String])?
        do throws(RedisError) {
            found = try await policy.handOver(token: token, topic: topic, now: nowMilliseconds(), owner: DevicePolicy.handOverOwner())
        } catch {
            health.redisFailed(error, by: .mailboxes)
            found = nil
        }
        guard let found, !found.entries.isEmpty || !found.unreadable.isEmpty else { return }
        await handOver(found.entries, unreadable: found.unreadable, by: found.holder ?? keeper, token: token, topic: topic, item, policy)
    }

    /// Moves a mailbox entry no relay will ever read aside, for an operator: no outage, and its
    /// intent gets no outcome (logged as an error, counted). `partition`: the due index that
    /// holds its member, if one does. False when it was not moved (a Redis failure, counted as
    /// one, or another relay's take or release came first).
    func quarantine(_ id: String, partition: TopicPartition?, token: String, topic: String, _ policy: DevicePolicy) async -> Bool {
        do throws(RedisError) {
            guard try await policy.quarantine(partition: partition, token: token, topic: topic, id: id) else { return false }
        } catch {
            health.redisFailed(error, by: .mailboxes)
            return false
        }
        RelayMetrics.mailboxEntriesQuarantined.increment()
        var metadata: Logger.Metadata = ["intent.id": "\(id)", "apns.topic": "\(topic)"]
        if let partition { metadata.merge(Self.entryMetadata(id, topic, partition)) { $1 } }
        metadata["redis.key"] = "\(policy.keys.quarantine(token: token, topic: topic, id: id))"
        logger.error("a mailbox entry no relay can read is quarantined; its intent gets no outcome", metadata: metadata)
        return true
    }

    /// Publishes `coalesced` for an intent a newer one displaced from its mailbox. Its badge
    /// change counts, as a coalesced intent's does (applied once per intent: it may have been
    /// applied already, when it was tried before it parked): the newer notification, sent
    /// later, carries the sum, and the outcome names the count it reached.
    /// An intent APNs answered already (its dedupe record holds APNs' answer) is not answered
    /// again: it went out after all (a park that failed part way, with `redis.fail_open` or
    /// refusals, left it in the mailbox while it was sent), so nothing is published and the
    /// entry is acknowledged all the same.
    @inline(never)
    func publishDisplaced(_ entry: DevicePolicy.Entry, by newer: String, _ item: WorkItem) async -> Bool {
        let displaced = mailboxItem(entry, token: nil, member: nil, generation: item.generation)
        if case .success(let intent) = displaced.intent, let policy, let redis,
           let recorded = await withRedisRetries(item, { () throws(RedisError) in
               try await redis.send(RedisCommand("GET", [policy.keys.seen(token: intent.recipient, topic: intent.topic, id: intent.id)]))
           }), let record = recorded.string.flatMap(AnswerRecord.init), record.status != Outcome.Status.coalesced.rawValue {
            logger.info("a displaced intent APNs answered already is not answered coalesced",
                        metadata: Self.entryMetadata(intent.id, intent.topic, displaced.partition).merging(["relay.recorded": "\(record.status)"]) { $1 })
            return true
        }
        var outcome = earlyOutcome(displaced, .coalesced(by: newer))
        outcome.supersededBy = newer.isEmpty ? nil : newer
        if case .success(let intent) = displaced.intent, let change = intent.badge, let badges {
            outcome.badge = await withRedisRetries(item) { () throws(RedisError) in
                try await badges.apply(change, intentID: intent.id, token: intent.token, topic: intent.topic)
            }
        }
        // Recorded, so that a redelivery of it is a duplicate and not sent after the newer one.
        if case .success(let intent) = displaced.intent, let deduplicator, let (status, window) = recordFields(Ending(outcome: outcome)) {
            _ = await withRedisRetries(item) { () throws(RedisError) in
                try await deduplicator.record(token: intent.recipient, topic: intent.topic, id: intent.id, status: status,
                                              window: window, lastSent: nil, onlyIfAbsent: true)
            }
            // Marked in the displaced intent's shard (its entry's partition's, not the newer
            // item's): where its copies queue.
            await recordedCoalesced(intent, in: shard(of: displaced.partition))
        }
        // Published while `item` (the newer intent) is handled: none of its trace goes with it.
        return await publish(Ending(outcome: outcome), item, carriesTrace: false)
    }

    /// Log metadata naming a mailbox entry of a due index (never its token).
    static func entryMetadata(_ id: String, _ topic: String, _ partition: TopicPartition) -> Logger.Metadata {
        ["intent.id": "\(id)", "apns.topic": "\(topic)", "kafka.partition": "\(partition.partition)", "kafka.topic": "\(partition.topic)"]
    }

    /// A work item for an intent kept in a mailbox (its offset is not stored again), with the
    /// trace context kept beside it: traced from now on when spans are exported. `partition`:
    /// the one whose due index held it, when it was taken from one (else the entry says).
    func mailboxItem(_ entry: DevicePolicy.Entry, partition: TopicPartition? = nil, token: String?, member: String?, generation: Int,
                     admission: Admission = .send) -> WorkItem {
        let now = APNsIdentifiers.epochMilliseconds()
        var intent = Result { () throws(InvalidIntent) in
            try Intent.parse(entry.message, key: token.map { Array($0.utf8) }, now: clock(), defaultTTL: configuration.defaults.expirationSeconds)
        }
        if case .success(var parsed) = intent {
            parsed.expiration = entry.expiration
            intent = .success(parsed)
        }
        let partition = partition ?? TopicPartition(topic: entry.lane ?? configuration.kafka.intentsTopic, partition: entry.partition)
        var recordsAnswer = false
        if case .success = intent, case .send = admission { recordsAnswer = true }
        let trace = entry.trace.flatMap(Self.traceContext(stored:))
        return WorkItem(partition: partition, lane: lane(of: partition.topic), offset: entry.offset, generation: generation,
                        consumedAt: .now - .milliseconds(max(now - entry.consumedAt, 0)),
                        intent: intent, admission: admission, recordsAnswer: recordsAnswer, mailboxMember: member,
                        trace: trace, traced: Self.intentTrace(trace, tracer: tracer, policy: nil, id: try? intent.get().id),
                        // Everything in a mailbox was parked there.
                        policyDecision: "park",
                        // Its own coordinates, whichever due index it was found in.
                        origin: TopicPartition(topic: entry.lane ?? partition.topic, partition: entry.partition))
    }

    /// Ends a mailbox claim once its outcome is out (a failure only means the claim's lease
    /// runs out and the entry is taken again, then answered `duplicate`).
    func release(_ member: String, _ item: WorkItem) async {
        guard let policy, let parts = RedisKeys.parseMember(member) else { return }
        do throws(RedisError) {
            try await policy.release(partition: item.partition, token: parts.token, topic: parts.topic, id: parts.id,
                                     now: nowMilliseconds())
        } catch {
            health.redisFailed(error, by: .mailboxes)
        }
    }

    /// While running: every `policy.mailbox_poll_ms`, takes the mailbox entries that became due
    /// on the partitions this relay owns and sends them through their devices' queues, each
    /// intent's work in a child task; once the shutdown deadline passed (``abandoning``),
    /// cancels what is left.
    func deliverMailboxes() async {
        guard let policy else { return }
        let interval = Duration.milliseconds(configuration.policy.mailboxPollMilliseconds)
        await withDiscardingTaskGroup { workers in
            while await !stopping.wait(atMost: interval), !Task.isCancelled {
                await takeDueMailboxes(policy, workers: &workers)
            }
            await abandoning.wait()
            workers.cancelAll()
        }
    }

    /// Mailbox deliveries count against `limits.max_in_flight` in all (and, with lanes, against
    /// their lane's share, ``LaneLedger/mailboxRoom(_:)``): a poll asks each partition for at
    /// most what its lane has room for, takes the due members one partition after another in
    /// turn, and reserves a send slot before each take (given back when the take yields
    /// nothing to send).
    @inline(never)
    func takeDueMailboxes(_ policy: DevicePolicy, workers: inout DiscardingTaskGroup) async {
        // As the shards last published them (an assignment or revocation since is found at the
        // claim, on the shard's loop).
        let owned = laneTopics.flatMap { topic in
            shards.flatMap { shard in
                shard.publishedPartitions.generations.filter { $0.key.topic == topic }.map { (partition: $0.key, generation: $0.value) }
            }
        }
        let rooms = state.withLock { state in laneTopics.indices.map { state.lanes.mailboxRoom($0) } }
        let withRoom = owned.filter { rooms[lane(of: $0.partition.topic)] > 0 }
        guard !withRoom.isEmpty else { return }
        let generations = Dictionary(owned.map { ($0.partition, $0.generation) }, uniquingKeysWith: { $1 })
        let now = nowMilliseconds()
        let found: [(partition: TopicPartition, member: String)]
        // A poll that read every index and whose takes all succeeded (or that had none to do)
        // ends the mailboxes' trouble (a release or hand-over that failed): with no intent
        // coming it may be the only call there is.
        var readEvery = false, takeFailed = false
        defer { if readEvery && !takeFailed { health.redisRecovered(by: .mailboxes) } }
        do {
            let read = try await policy.due(partitions: withRoom.map(\.partition).sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) },
                                            now: now, limit: min(rooms.max() ?? 0, 500))
            found = read.due
            // Some partitions' indexes could not be read: the others are taken from. Every one
            // read: an earlier poll's trouble is over (the poll may be the only call while no
            // intent comes, and would otherwise leave it the relay's Redis trouble for good).
            if let failed = read.failed {
                health.redisFailed(failed, by: .poll)
            } else {
                health.redisRecovered(by: .poll)
                readEvery = true
            }
        } catch {
            health.redisFailed(error, by: .poll)
            return
        }
        if !found.isEmpty, let hook = afterDueRead.current { hook(Array(Set(found.map(\.partition)))) }
        // Takes failing one after another (Redis down) end the poll; one failing take (its
        // node's trouble, its entry's) does not hold up the others.
        var failingTakes = 0
        for (partition, member) in Self.inTurn(found) where !stopping.isOpen && !Task.isCancelled && failingTakes < Self.failingTakesPerPoll {
            let lane = lane(of: partition.topic)
            // Only for partitions still ours (a rebalance may have taken one since the query),
            // and while there is room: the send slot is reserved here.
            // On the shard that handed out the generation read (where it is still ours if it is).
            let generation = generations[partition] ?? -1
            let claimed = await shards[Self.shardIndex(ofGeneration: generation, shards: shards.count)].onLoop { shard in
                guard shard.partitions.isActive(partition, generation: generation) else { return false }
                return self.state.withLock { state in
                    guard state.lanes.mailboxRoom(lane) > 0, self.mailboxJobs.claim(member) else { return false }
                    state.lanes.admitted(lane)
                    return true
                }
            }
            guard claimed else { continue }
            var started = false
            defer { if !started { unreserve(lane, member: member) } }
            guard let parts = RedisKeys.parseMember(member) else {
                _ = try? await policy.reindex(partition: partition, member: member, due: nil)
                continue
            }
            let taken: DevicePolicy.Take
            do {
                taken = try await policy.take(partition: partition, token: parts.token, topic: parts.topic, id: parts.id,
                                              rules: configuration.policy.rules(for: parts.topic, recipient: parts.token), now: nowMilliseconds())
            } catch {
                guard error.isRefusal else {
                    health.redisFailed(error, by: .mailboxes)
                    failingTakes += 1
                    takeFailed = true
                    continue
                }
                // Not an outage: its index member already moved to the lease's end, so it is
                // asked again then; the other entries go on.
                RelayMetrics.redisRefused.increment()
                var metadata = Self.entryMetadata(parts.id, parts.topic, partition)
                metadata["redis.error"] = "\(error)"
                logger.error("Redis refuses taking a mailbox entry", metadata: metadata)
                continue
            }
            failingTakes = 0
            let item: WorkItem
            switch taken {
            case .stale, .notYet:
                // Not yet: the member moves to its new due time; stale: it goes.
                let next: Int64? = if case .notYet(let next) = taken { next } else { nil }
                _ = try? await policy.reindex(partition: partition, member: member, due: next)
                continue
            case .behindAbandonedClaim(let other):
                // The abandoned claim's member (back in the index if it went missing) is taken
                // first. This one stays where the take put it, at the lease's end: the claim's
                // release moves it up (a plain reindex here could undo that move, had the
                // release come first).
                _ = try? await policy.ensureIndexed(partition: partition, token: parts.token, topic: parts.topic, id: other, now: now)
                continue
            case .unreadable:
                // Not an outage: no relay will ever read it. Moved aside, for an operator.
                _ = await quarantine(parts.id, partition: partition, token: parts.token, topic: parts.topic, policy)
                continue
            case .behindClaim(let until):
                // At the claim's lease end at the latest (the take moved it a little later), and
                // earlier once the claim's release moved it up — which may have come first.
                _ = try? await policy.reindex(partition: partition, member: member, due: until, onlyEarlier: true)
                continue
            case .answered(let entry, let record):
                item = mailboxItem(entry, partition: partition, token: parts.token, member: member, generation: generation,
                                   admission: .duplicate(record))
            case .expired(let entry):
                item = mailboxItem(entry, partition: partition, token: parts.token, member: member, generation: generation,
                                   admission: .expiredParked)
            case .claimed(let entry):
                item = mailboxItem(entry, partition: partition, token: parts.token, member: member, generation: generation)
            case .displaced(let displaced):
                // Its hand-over did not end (its relay died, or the publish failed): this poll's.
                // Published here, as the park that displaced it would have; nothing is sent.
                let item = mailboxItem(displaced.entry, partition: partition, token: parts.token, member: nil, generation: generation)
                await handOver([displaced], by: displaced.by ?? "", token: parts.token, topic: parts.topic, item, policy)
                continue
            }
            // What the mailbox still holds displaced goes out first (older than this one).
            await handOverDisplaced(token: parts.token, topic: parts.topic, keeper: parts.id, item, policy)
            // Its slot was reserved before the take.
            started = true
            let start = await shard(of: item).onLoop { shard in self.state.withLock { state in Self.enqueue(item, &shard, &state) } }
            // On its shard's event loop, as an intent admitted from Kafka is worked.
            if let start { workers.addTask(executorPreference: shardExecutor(of: start)) { await self.work(start) } }
        }
    }

    /// Takes in a row that may fail before a poll gives up until the next one.
    static let failingTakesPerPoll = 3

    /// Gives back a slot reserved for a take that yields nothing to send, and its member's job.
    private func unreserve(_ lane: Int, member: String) {
        let (waiters, idleWaiters) = state.withLock { state -> ([CheckedContinuation<Void, Never>], [CheckedContinuation<Bool, Never>]) in
            state.lanes.finished(lane)
            mailboxJobs.end(member)
            // A drain waiting for the relay to be idle: this reservation may have been the last.
            var idle: [CheckedContinuation<Bool, Never>] = []
            if state.inFlight == 0, !state.idleWaiters.isEmpty {
                idle = Array(state.idleWaiters.values)
                state.idleWaiters.removeAll()
            }
            return (state.lanes.waitersWithRoom(), idle)
        }
        for waiter in waiters { waiter.resume() }
        for waiter in idleWaiters { waiter.resume(returning: true) }
    }

    /// Due members from every partition, one partition after another in turn: when room runs
    /// out part way, no partition's entries were passed over for another's.
    static func inTurn(_ found: [(partition: TopicPartition, member: String)]) -> [(partition: TopicPartition, member: String)] {
        var byPartition: [TopicPartition: [String]] = [:], order: [TopicPartition] = []
        for (partition, member) in found {
            if byPartition[partition] == nil { order.append(partition) }
            byPartition[partition, default: []].append(member)
        }
        var result: [(partition: TopicPartition, member: String)] = []
        result.reserveCapacity(found.count)
        var round = 0
        while result.count < found.count {
            for partition in order where round < byPartition[partition]!.count {
                result.append((partition, byPartition[partition]![round]))
            }
            round += 1
        }
        return result
    }
}
