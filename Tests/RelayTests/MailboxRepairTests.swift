import APNs
import Common
import Foundation
import Redis
@testable import Relay
import RedisTesting
import KafkaTesting
import Kafka
import TestSupport
import Testing

/// Mailboxes left in the states a crash, a rebalance or a race leaves them in (written straight
/// into a real redis-server), and what the relay makes of them.
@Suite("Mailboxes left half-written", .stopsItsRelays, .timeLimit(.minutes(3)))
struct MailboxRepairTests {
    static func nowMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    static func entry(_ json: String, expiration: Int64) -> [UInt8] {
        DevicePolicy.Entry(partition: 0, offset: 0, consumedAt: nowMilliseconds(), expiration: expiration,
                           message: Array(json.utf8)).encoded
    }

    /// The commands that leave `id` (an intent for `token`) parked in its mailbox and due now in
    /// `partition`'s index, as a park and its index write leave it.
    static func dueEntry(_ id: String, token: String, partition: Int32, intentsTopic: String, expiration: Int64) -> [RedisCommand] {
        [
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"), "pid", id,
                                  "p", Self.entry(intent(id, token: token), expiration: expiration), "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "\(id.utf8.count):\(id)"]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: intentsTopic, partition: partition), 0,
                                  RedisKeys.member(token: token, topic: "com.example.app", id: id)]),
        ]
    }

    /// A relay that owns its partitions and polls their mailboxes: it answered one intent.
    static func pollingRelay(_ redis: RedisServerProcess) async throws -> RelayHarness {
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)
        return harness
    }

    /// Review 1.1: the relay died between the park script and the due-index `ZADD`. Its intent's
    /// offset was not committed, so the intent comes again; it must be delivered, not taken for
    /// "already in the mailbox" and left there unindexed.
    @Test func aParkWhoseIndexWriteNeverHappenedIsDeliveredWhenItsIntentComesAgain() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0x1a)
        let json = intent("stranded-1", token: token)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"),
                                  "pid", "stranded-1", "p", Self.entry(json, expiration: expiration), "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "10:stranded-1"]),
        ])
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        try await harness.produce(json, key: token)
        let outcomes = try await harness.outcomes(count: 1)
        #expect(outcomes.map { $0["id"] as? String } == ["stranded-1"])
        #expect(outcomes.first?["status"] as? String == "delivered")
        #expect(PolicyTests.sent(harness, "stranded-1") == 1)
        try await harness.stopExpectingOneOutcomeEach()
        await client.shutdown()
    }

    /// A displaced entry's `coalesced` outcome does not wait for a later park of its device: the
    /// relay that displaced it died before publishing it, and the newer intent, redelivered,
    /// finds itself in the mailbox. That path hands the displaced entry over too; so does a
    /// take of the mailbox.
    @Test(arguments: [false, true])
    func aDisplacedEntryIsHandedOverByEveryPathThatFindsItsMailbox(takenByThePoller: Bool) async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(takenByThePoller ? 0x1c : 0x1b)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        _ = try await client.pipeline([
            RedisCommand("HSET", [mailbox, "pid", "newer", "p", Self.entry(intent("newer", token: token), expiration: expiration),
                                  "pe", expiration, "pd", 0, "d:older", Self.entry(intent("older", token: token), expiration: expiration)]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "5:newer"]),
        ])
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10)
        if takenByThePoller {
            // Indexed (the park's index write happened): the poller takes it, no redelivery.
            _ = try await client.send(RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0), 0,
                                                            RedisKeys.member(token: token, topic: "com.example.app", id: "newer")]))
        } else {
            try await harness.produce(intent("newer", token: token), key: token)
        }
        try await harness.published.waitUntil(timeout: .seconds(20)) { published in
            ["older", "newer"].allSatisfy { id in published.all.contains { $0.id == id } }
        }
        let outcomes = harness.published.value.all
        let older = try #require(outcomes.first { $0.id == "older" })
        #expect(older.status == .coalesced && older.supersededBy == "newer", "\(older.status) \(older.supersededBy ?? "-")")
        #expect(outcomes.first { $0.id == "newer" }?.status == .delivered)
        #expect(PolicyTests.sent(harness, "older") == 0)
        try await waitUntil(asking: { (try? await client.send(RedisCommand("HEXISTS", [mailbox, "d:older"])))?.integer == 0 })
        await harness.stop()
        await client.shutdown()
    }

    /// Review 2.2: a mailbox entry found answered (or expired) when it is taken stays in the
    /// mailbox, as the take's claim, until its outcome is out; while outcomes cannot be
    /// published it is still there (a relay dying now would leave it to be taken again).
    @Test func anAnsweredEntryLeavesItsMailboxOnlyOnceItsOutcomeIsOut() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0x2c)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        let member = RedisKeys.member(token: token, topic: "com.example.app", id: "answered-1")
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        // Outcome records time out after 1 s while the brokers refuse them.
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10, configure: { $0.kafka.properties["message.timeout.ms"] = "1000" })
        try await harness.produce(intent("warm-up", token: hexToken(2)), key: hexToken(2))
        _ = try await harness.outcomes(count: 1)
        harness.cluster.failRequests(apiKey: KafkaMockCluster.APIKey.produce, errorCode: KafkaErrorCode.notEnoughReplicas)
        _ = try await client.pipeline([
            RedisCommand("HSET", [mailbox, "pid", "answered-1", "p", Self.entry(intent("answered-1", token: token), expiration: expiration),
                                  "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "10:answered-1"]),
            RedisCommand("SET", [RedisKeys.standard.seen(token: token, topic: "com.example.app", id: "answered-1"), "2 delivered 200 - - -"]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0), 0, member]),
        ])
        // Taken (it became the take's claim), its outcome not out: still in the mailbox.
        try await waitUntil(asking: { (try? await client.send(RedisCommand("HGET", [mailbox, "cid"])))?.string == "answered-1" })
        try await harness.pipeline.incidents.waitUntil { $0.publishFailures > 0 }
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "cid"])).string == "answered-1")
        harness.cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.produce)
        let outcomes = try await harness.outcomes(count: 2)
        #expect(outcomes.first { $0["id"] as? String == "answered-1" }?["status"] as? String == "duplicate")
        // Out: the claim and its index member go.
        try await waitUntil(asking: { (try? await client.send(RedisCommand("HGET", [mailbox, "cid"])))?.isNull == true })
        #expect(PolicyTests.sent(harness, "answered-1") == 0)
        await harness.stop()
        await client.shutdown()
    }

    /// A parked entry that is due while another intent's claim still runs waits for that claim
    /// (one notification at a time per device and app); the claim is not overwritten.
    @Test func aDueEntryWaitsForAnotherIntentsLiveClaim() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let token = hexToken(0x1c)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let leaseEnd = Self.nowMilliseconds() + 100_000
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        let member = RedisKeys.member(token: token, topic: "com.example.app", id: "parked-2")
        let due = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [mailbox, "cid", "claimed-1", "c", Self.entry(intent("claimed-1", token: token), expiration: expiration),
                                  "ce", expiration, "cu", leaseEnd,
                                  "pid", "parked-2", "p", Self.entry(intent("parked-2", token: token), expiration: expiration),
                                  "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "8:parked-2claimed-1"]),
            RedisCommand("ZADD", [due, 0, member]),
        ])
        try await waitUntil(asking: {
            let score = try? await client.send(RedisCommand("ZSCORE", [due, member]))
            return score?.string.flatMap { Int64($0) } == leaseEnd
        })
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "cid"])).string == "claimed-1")
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "pid"])).string == "parked-2")
        #expect(PolicyTests.sent(harness, "parked-2") == 0)
        try await harness.stopExpectingOneOutcomeEach()
        await client.shutdown()
    }

    /// Review 1.2: a relay takes mailbox entries only for the partitions it owns. Two due
    /// entries written together, one indexed under an owned partition and one under a
    /// partition the relay does not own: the poll that delivers the first leaves the second,
    /// its mailbox and its index member as they were.
    @Test func aRelayTakesNothingFromPartitionsItDoesNotOwn() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([("owned-1", hexToken(0x3a), Int32(0)), ("foreign-1", hexToken(0x3b), Int32(999))].flatMap {
            Self.dueEntry($0.0, token: $0.1, partition: $0.2, intentsTopic: harness.intentsTopic, expiration: expiration)
        })
        let outcomes = try await harness.outcomes(count: 2)
        #expect(outcomes.compactMap { $0["id"] as? String }.sorted() == ["owned-1", "warm-up"])
        let foreign = RedisKeys.standard.mailbox(token: hexToken(0x3b), topic: "com.example.app")
        #expect(try await client.send(RedisCommand("HGET", [foreign, "pid"])).string == "foreign-1")
        #expect(try await client.send(RedisCommand("HEXISTS", [foreign, "cid"])).integer == 0)
        #expect(try await client.send(RedisCommand("ZSCORE", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 999),
                                                               RedisKeys.member(token: hexToken(0x3b), topic: "com.example.app", id: "foreign-1")])).string == "0")
        #expect(PolicyTests.sent(harness, "foreign-1") == 0)
        await harness.stop()
        await client.shutdown()
    }

    /// Review 1.2, the race itself: the partition is taken away after the poll read its due
    /// index and before the take. The entry stays in its mailbox, unclaimed and indexed, for
    /// the partition's next owner; nothing is sent.
    @Test func aPartitionLostBetweenTheDueReadAndTheTakeIsNotTakenFrom() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0x3e)
        let lost = AsyncLatch()
        harness.pipeline.afterDueRead.set { [pipeline = harness.pipeline] partitions in
            // As librdkafka's revocation does, on another thread, before the takes.
            guard !lost.isOpen else { return }
            pipeline.partitionsRevoking(partitions, lost: true)
            lost.open()
        }
        _ = try await client.pipeline(Self.dueEntry("raced-1", token: token, partition: 2, intentsTopic: harness.intentsTopic,
                                                    expiration: expiration))
        #expect(await lost.wait(atMost: .seconds(20)))
        // The poll that read it went on to its takes (a second poll begins after it).
        let polled = AsyncLatch()
        harness.pipeline.afterDueRead.set { _ in polled.open() }
        #expect(await polled.wait(atMost: .seconds(20)))
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "pid"])).string == "raced-1")
        #expect(try await client.send(RedisCommand("HEXISTS", [mailbox, "cid"])).integer == 0)
        #expect(try await client.send(RedisCommand("ZSCORE", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 2),
                                                               RedisKeys.member(token: token, topic: "com.example.app", id: "raced-1")])).string == "0")
        #expect(PolicyTests.sent(harness, "raced-1") == 0)
        await harness.stop()
        await client.shutdown()
    }

    /// One partition's due index that cannot be read (here: a key of another type; in a Redis
    /// Cluster, a node in trouble) does not stop the poll for the other partitions, nor does
    /// an entry whose take fails.
    @Test func onePartitionsUnreadableIndexDoesNotStopThePollForTheOthers() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0x3c), broken = hexToken(0x3d)
        _ = try await client.pipeline([
            // Partition 3's index is not a sorted set.
            RedisCommand("SET", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 3), "not-an-index"]),
            // On partition 1: an entry whose mailbox holds an unreadable entry, due before the good one.
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: broken, topic: "com.example.app"), "pid", "broken-1", "p", "garbage",
                                  "pe", expiration, "pd", 0]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 1), 0,
                                  RedisKeys.member(token: broken, topic: "com.example.app", id: "broken-1")]),
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"), "pid", "due-1",
                                  "p", Self.entry(intent("due-1", token: token), expiration: expiration), "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "5:due-1"]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 1), 1,
                                  RedisKeys.member(token: token, topic: "com.example.app", id: "due-1")]),
        ])
        try await harness.published.waitUntil(timeout: .seconds(20)) { published in published.all.contains { $0.id == "due-1" } }
        #expect(harness.published.value.all.first { $0.id == "due-1" }?.status == .delivered)
        await harness.stop()
        await client.shutdown()
    }

    /// A poll whose due-index read failed reports Redis trouble; once its reads succeed again
    /// the trouble is over, though no intent comes meanwhile (the poll was the only call that
    /// could clear it, and /readyz named a trouble long gone).
    @Test func aPollsTroubleEndsWithItsNextFullRead() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let index = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 2)
        _ = try await client.send(RedisCommand("SET", [index, "not-an-index"]))
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble != nil }
        _ = try await client.send(RedisCommand("DEL", [index]))
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble == nil }
        await harness.stop()
        await client.shutdown()
    }

    /// A take that failed (Redis refusing writes: `NOREPLICAS`) is Redis trouble until a poll
    /// reads every index and takes what it found; no intent needs to come meanwhile.
    @Test func aFailedTakesTroubleEndsWithTheNextCleanPoll() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0x3e)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        // Due in 3 s; Redis refuses writes from the next moment on, so the take fails.
        let due = Self.nowMilliseconds() + 3000
        for reply in try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"), "pid", "due-2",
                                  "p", Self.entry(intent("due-2", token: token), expiration: expiration), "pe", expiration, "pd", due]),
            RedisCommand("ZADD", [RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 2), due,
                                  RedisKeys.member(token: token, topic: "com.example.app", id: "due-2")]),
            RedisCommand("CONFIG", ["SET", "min-replicas-to-write", "1"]),
        ]) {
            if case .error(let message) = reply { Issue.record("\(message)") }
        }
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble?.contains("NOREPLICAS") == true }
        _ = try await client.send(RedisCommand("CONFIG", ["SET", "min-replicas-to-write", "0"]))
        try await harness.published.waitUntil(timeout: .seconds(20)) { published in published.all.contains { $0.id == "due-2" } }
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble == nil }
        await harness.stop()
        await client.shutdown()
    }

    /// Mailbox deliveries count against `limits.max_in_flight` in all, not per partition: 200
    /// due entries over the four partitions, APNs taking 1 s each, and never more than 10 sends
    /// under way (each poll took up to 10 per partition, 40 at once, before).
    @Test func mailboxDeliveriesStayWithinMaxInFlightInAll() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await PolicyTests.harness(redis, burst: 10, refill: 10, configure: { $0.limits.maxInFlight = 10 },
                                                    simulator: { $0.behaviour.latency = .milliseconds(1000) })
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline((0..<200).flatMap { index in
            Self.dueEntry("parked-\(index)", token: hexToken(0x4000 + index), partition: Int32(index % 4),
                          intentsTopic: harness.intentsTopic, expiration: expiration)
        })
        // Watched while they drain (20 s at 10 at a time).
        let peak = Locked(0)
        let watching = Task {
            while !Task.isCancelled {
                let sending = harness.pipeline.sending
                peak.withLock { $0 = max($0, sending) }
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
        try await harness.published.waitUntil(timeout: .seconds(90)) { $0.count("delivered") == 201 }
        watching.cancel()
        #expect(peak.withLock { $0 } <= 10, "\(peak.withLock { $0 }) sends under way at once")
        #expect(peak.withLock { $0 } >= 5, "the watch saw the sends")
        await harness.stop()
        await client.shutdown()
    }

    /// Review 2.2: a displaced entry stays in the mailbox until its `coalesced` outcome is
    /// acknowledged: a park whose reply was lost, asked again, still hands it over.
    @Test func aDisplacedEntryIsHandedOverUntilItsOutcomeIsAcknowledged() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let policy = DevicePolicy(client: client, keys: .standard, intentsTopic: "intents", backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        let token = hexToken(0x2d)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        func park(_ id: String, owner: String) async throws -> [DevicePolicy.Displaced] {
            let entry = DevicePolicy.Entry(partition: 0, offset: 0, consumedAt: Self.nowMilliseconds(), expiration: expiration,
                                           message: Array(intent(id, token: token).utf8))
            return try await policy.park(token: token, topic: "com.example.app", id: id, entry: entry, due: Self.nowMilliseconds() + 60_000,
                                         now: Self.nowMilliseconds(), tooManyRequests: false, owner: owner).displaced
        }
        #expect(try await park("older", owner: "a").isEmpty)
        #expect(try await park("newer", owner: "b").map(\.id) == ["older"])
        // The reply was lost: the relay parks again (the same park, the same owner), and is
        // handed the displaced entry again.
        let again = try await park("newer", owner: "b")
        #expect(again.map(\.id) == ["older"] && again.allSatisfy(\.mine) && again.first?.by == "newer")
        try await policy.acknowledgeDisplaced(#require(again.first), token: token, topic: "com.example.app")
        #expect(try await park("newer", owner: "c").isEmpty)
        #expect(try await park("newest", owner: "d").map(\.id) == ["newer"])
        await client.shutdown()
    }

    /// A displaced entry's `coalesced` outcome is published by one hand-over: two relays finding
    /// its mailbox at once (a park on one, a take or a redelivery on the other) are not both
    /// handed it, so it is not answered twice. Its due-index member stands at the lease's end:
    /// if the relay holding the lease dies, the partition's poll hands it over then.
    @Test func aDisplacedEntryIsHandedToOneRelayAtATime() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        var policy = DevicePolicy(client: client, keys: .standard, intentsTopic: "intents", backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        policy.claimLeaseMilliseconds = 60_000
        let token = hexToken(0x2f), topic = "com.example.app"
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let now = Self.nowMilliseconds()
        func park(_ id: String, offset: Int64, owner: String) async throws -> [DevicePolicy.Displaced] {
            let entry = DevicePolicy.Entry(partition: 1, offset: offset, consumedAt: now, expiration: expiration,
                                           message: Array(intent(id, token: token).utf8))
            return try await policy.park(token: token, topic: topic, id: id, entry: entry, due: now + 600_000, now: now,
                                         tooManyRequests: false, owner: owner).displaced
        }
        _ = try await park("older", offset: 1, owner: "relay-a")
        let first = try await park("newer", offset: 2, owner: "relay-a")
        #expect(first.map(\.id) == ["older"] && first.allSatisfy(\.mine))
        // Relay A died before publishing. Relay B finds the mailbox meanwhile: it is told of the
        // entry, not handed it.
        let found = try await policy.handOver(token: token, topic: topic, now: now + 1_000, owner: "relay-b")
        #expect(found.holder == "newer")
        #expect(found.entries.map(\.id) == ["older"] && !found.entries.contains(where: \.mine), "\(found.entries)")
        #expect(found.entries.first?.leaseEnds == now + 60_000)
        // Its due-index member waits for the lease's end.
        let partition = TopicPartition(topic: "intents", partition: 1)
        let member = RedisKeys.member(token: token, topic: topic, id: "older")
        #expect(try await client.send(RedisCommand("ZSCORE", [policy.dueKey(partition: partition), member])).string == "\(now + 60_000)")
        // A take before then is told to ask again at the lease's end.
        let early = try await policy.take(partition: partition, token: token, topic: topic, id: "older", rules: .init(), now: now + 2_000)
        guard case .notYet(let due) = early else { Issue.record("\(early)"); return }
        #expect(due == now + 60_000)
        // At the lease's end the partition's poll takes it, for its hand-over; and then nobody
        // else is handed it.
        let taken = try await policy.take(partition: partition, token: token, topic: topic, id: "older", rules: .init(), now: now + 60_001)
        guard case .displaced(let displaced) = taken else { Issue.record("\(taken)"); return }
        #expect(displaced.id == "older" && displaced.by == "newer")
        #expect(try await policy.handOver(token: token, topic: topic, now: now + 60_002, owner: "relay-c").entries.allSatisfy { !$0.mine })
        try await policy.acknowledgeDisplaced(displaced, token: token, topic: topic)
        #expect(try await policy.handOver(token: token, topic: topic, now: now + 60_003, owner: "relay-c").entries.isEmpty)
        #expect(try await client.send(RedisCommand("ZSCORE", [policy.dueKey(partition: partition), member])) == .null)
        await client.shutdown()
    }

    /// An intent displaced from its mailbox whose `coalesced` outcome is not out yet, redelivered
    /// once the intent that displaced it has left the mailbox (delivered), stays displaced: it is
    /// not parked again, which would send it after its successor.
    @Test func aDisplacedIntentRedeliveredIsNotParkedAgain() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let policy = DevicePolicy(client: client, keys: .standard, intentsTopic: "intents", backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        let token = hexToken(0x2a1), topic = "com.example.app"
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: topic)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        func park(_ id: String, offset: Int64) async throws -> (displaced: [DevicePolicy.Displaced], keeper: String) {
            let entry = DevicePolicy.Entry(partition: 0, offset: offset, consumedAt: Self.nowMilliseconds(), expiration: expiration,
                                           message: Array(intent(id, token: token).utf8))
            let parked = try await policy.park(token: token, topic: topic, id: id, entry: entry, due: Self.nowMilliseconds() + 60_000,
                                               now: Self.nowMilliseconds(), tooManyRequests: false, owner: DevicePolicy.handOverOwner())
            return (parked.displaced, parked.keeper)
        }
        _ = try await park("older", offset: 1)
        #expect(try await park("newer", offset: 2).displaced.map(\.id) == ["older"])
        // The newer one was delivered and released; the relay handing the older one over died.
        _ = try await client.send(RedisCommand("HDEL", [mailbox, "pid", "p", "pe", "pd"]))
        let again = try await park("older", offset: 1)
        #expect(again.keeper == "newer", "\(again.keeper)")
        #expect(again.displaced.map(\.id) == ["older"])
        #expect(try await client.send(RedisCommand("HEXISTS", [mailbox, "pid"])).integer == 0, "parked again")
        await client.shutdown()
    }

    /// Review 1.1's other half: a park that ran but was not known to (Redis failing after it,
    /// with `redis.fail_open`, or refusals) leaves the intent in the mailbox while it is sent. When
    /// a newer park displaces it there, its hand-over finds APNs' answer in its dedupe record and
    /// publishes nothing: no `coalesced` after `delivered`. A displaced intent never answered is
    /// answered `coalesced` as before.
    @Test func aDisplacedIntentAPNsAnsweredIsNotAnsweredAgain() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0x3f), topic = "com.example.app"
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: topic)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let index = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 1)
        var commands: [RedisCommand] = [
            RedisCommand("SET", [RedisKeys.standard.seen(token: token, topic: topic, id: "sent-anyway"), "delivered", "EX", 3600]),
        ]
        for id in ["sent-anyway", "never-sent"] {
            commands.append(RedisCommand("HSET", [mailbox, "d:" + id, Self.entry(intent(id, token: token), expiration: expiration),
                                                  "db:" + id, "newest"]))
            commands.append(RedisCommand("ZADD", [index, 0, RedisKeys.member(token: token, topic: topic, id: id)]))
        }
        for reply in try await client.pipeline(commands) {
            if case .error(let message) = reply { Issue.record("\(message)") }
        }
        // Both handed over by the poll: the entries leave the mailbox.
        try await waitUntil(timeout: .seconds(20), asking: {
            (try? await client.send(RedisCommand("HLEN", [mailbox])))?.integer == 0
        })
        let published = harness.published.value.all.filter { $0.id == "sent-anyway" || $0.id == "never-sent" }
        #expect(published.map { "\($0.id ?? "?") \($0.status.rawValue)" } == ["never-sent coalesced"])
        await harness.stop()
        await client.shutdown()
    }

    /// An older intent of the partition (a redelivery after a crash) never displaces a newer one
    /// from the mailbox, parked or being sent: it is displaced itself, `coalesced` by the newer.
    @Test func anOlderIntentNeverDisplacesANewerOneFromTheMailbox() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let policy = DevicePolicy(client: client, keys: .standard, intentsTopic: "intents", backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        let token = hexToken(0x2e)
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        func entry(_ id: String, offset: Int64) -> DevicePolicy.Entry {
            DevicePolicy.Entry(partition: 3, offset: offset, consumedAt: Self.nowMilliseconds(), expiration: expiration,
                               message: Array(intent(id, token: token).utf8))
        }
        var handedOver: [DevicePolicy.Displaced] = []
        func park(_ id: String, offset: Int64) async throws -> (displaced: [String], keeper: String) {
            let parked = try await policy.park(token: token, topic: "com.example.app", id: id, entry: entry(id, offset: offset),
                                               due: Self.nowMilliseconds() + 60_000, now: Self.nowMilliseconds(), tooManyRequests: false,
                                               owner: DevicePolicy.handOverOwner())
            handedOver = parked.displaced.filter(\.mine)
            return (handedOver.map(\.id), parked.keeper)
        }
        func acknowledge() async throws {
            for displaced in handedOver { try await policy.acknowledgeDisplaced(displaced, token: token, topic: "com.example.app") }
        }
        let index = RedisKeys.standard.due(intentsTopic: "intents", partition: 3)
        #expect(try await park("newer", offset: 10) == ([], "newer"))
        #expect(try await park("older", offset: 5) == (["older"], "newer"))
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "pid"])).string == "newer")
        // The older one is indexed only for its hand-over's lease end (its outcome not out yet),
        // and no longer once that is acknowledged.
        #expect(try await client.send(RedisCommand("ZCARD", [index])).integer == 2)
        try await acknowledge()
        #expect(try await client.send(RedisCommand("ZCARD", [index])).integer == 1)

        // The same with the newer one being sent (claimed) and nothing parked.
        _ = try await client.send(RedisCommand("DEL", [mailbox]))
        _ = try await client.send(RedisCommand("HSET", [mailbox, "cid", "sending", "c", entry("sending", offset: 20).encoded,
                                                        "ce", expiration, "cu", Self.nowMilliseconds() + 60_000]))
        #expect(try await park("stale", offset: 15) == (["stale"], "sending"))
        #expect(try await client.send(RedisCommand("HEXISTS", [mailbox, "pid"])).integer == 0)
        try await acknowledge()
        // A newer one than the one being sent parks behind it as before.
        #expect(try await park("next", offset: 21) == ([], "next"))
        // The one being sent meets a 429 and parks again: the newer one behind it keeps the
        // mailbox, and its claim ends (it comes out `coalesced`; nothing is left to send it).
        #expect(try await park("sending", offset: 20) == (["sending"], "next"))
        #expect(try await client.send(RedisCommand("HEXISTS", [mailbox, "cid"])).integer == 0)
        #expect(try await client.send(RedisCommand("GET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app")])).string == "4:next")
        await client.shutdown()
    }

    /// Review 1.2: a take that finds another relay's claim with its lease still running must
    /// not drop the claim's due-index member (the claim would never be retried if that relay
    /// then lost the partition); the member moves to the lease's end.
    @Test func aLiveClaimKeepsItsIndexMemberUntilItsLeaseEnds() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.pollingRelay(redis)
        let token = hexToken(0x1b)
        let expiration = Int64(Date().timeIntervalSince1970) + 3600
        let leaseEnd = Self.nowMilliseconds() + 100_000
        let member = RedisKeys.member(token: token, topic: "com.example.app", id: "claimed-1")
        let due = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.pipeline([
            RedisCommand("HSET", [RedisKeys.standard.mailbox(token: token, topic: "com.example.app"),
                                  "cid", "claimed-1", "c", Self.entry(intent("claimed-1", token: token), expiration: expiration),
                                  "ce", expiration, "cu", leaseEnd]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: "com.example.app"), "0:claimed-1"]),
            RedisCommand("ZADD", [due, 0, member]),
        ])
        // The poller takes it (due 0) within 100 ms, finds the live claim, and moves it.
        try await waitUntil(asking: {
            let score = try? await client.send(RedisCommand("ZSCORE", [due, member]))
            return score?.string.flatMap { Int64($0) } == leaseEnd
        })
        #expect(PolicyTests.sent(harness, "claimed-1") == 0)
        try await harness.stopExpectingOneOutcomeEach()
        await client.shutdown()
    }
}
