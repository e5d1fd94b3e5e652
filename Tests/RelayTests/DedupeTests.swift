import APNs
import APNsSimulator
import Foundation
import Kafka
import Redis
@testable import Relay
import TestSupport
import Testing
import RedisTesting
import KafkaTesting

@Suite("Dedupe in Redis", .stopsItsRelays, .timeLimit(.minutes(3)))
struct DedupeTests {
    static func harness(_ redis: RedisServerProcess, failOpen: Bool = false,
                        simulator: (inout SimulatorConfiguration) -> Void = { _ in },
                        preload: [(json: String, key: String)] = []) async throws -> RelayHarness {
        try await harness(TestRedis(redis), failOpen: failOpen, simulator: simulator, preload: preload)
    }

    static func harness(_ redis: TestRedis, failOpen: Bool = false,
                        simulator: (inout SimulatorConfiguration) -> Void = { _ in },
                        preload: [(json: String, key: String)] = []) async throws -> RelayHarness {
        try await RelayHarness.start(configure: simulator, configureRelay: {
            redis.apply(to: &$0)
            // Short, for fail-open to go on soon; longer where a sanitizer slows everything.
            $0.redis.timeoutMilliseconds = 300 * sanitizerSlowdown
            $0.redis.failOpen = failOpen
            $0.policy.dedupeWindowSeconds = 3600
            // A minute per APNs request (here and in the tests below that start their own
            // relay): these tests count what reached APNs, and a request that a starved
            // sanitizer run timed out after the simulator took it is sent again (the second
            // send docs/outcomes.md allows after a lost answer, not a dedupe miss).
            $0.apns.requestTimeoutSeconds = 60
        }, preload: preload)
    }

    static func byID(_ outcomes: [[String: Any]]) -> [String: [[String: Any]]] {
        Dictionary(grouping: outcomes) { $0["id"] as? String ?? "" }
    }

    @Test(arguments: RedisKind.allCases)
    func anAnsweredIntentIsADuplicateWhenItComesAgain(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let harness = try await Self.harness(redis)
        try await harness.produce(intent("d-1", token: hexToken(1)), key: hexToken(1))
        let first = try await harness.outcomes(count: 1)
        #expect(first.first?["status"] as? String == "delivered")

        try await harness.produce(intent("d-1", token: hexToken(1)), key: hexToken(1))
        try await harness.produce(intent("d-2", token: hexToken(1)), key: hexToken(1))
        let all = Self.byID(try await harness.outcomes(count: 3))
        let again = try #require(all["d-1"]?.first { $0["status"] as? String == "duplicate" })
        #expect(again["reason"] as? String == "AlreadyAnswered")
        #expect(again["attempts"] as? Int == 0)
        // What APNs answered the first time comes with it.
        #expect(again["original_status"] as? String == "delivered")
        #expect(again["http_status"] as? Int == 200)
        #expect(again["token"] as? String == hexToken(1))
        #expect(again["apns_id"] as? String == APNsIdentifiers.format(Intent.apnsID(for: "d-1")))
        #expect(all["d-2"]?.first?["status"] as? String == "delivered")
        let sentD1 = harness.simulator.accepted.filter { $0.apnsID == APNsIdentifiers.format(Intent.apnsID(for: "d-1")) }
        #expect(sentD1.count == 1)

        // The record holds the answer, with the window as its TTL.
        let client = try redis.client()
        let apnsID = APNsIdentifiers.format(Intent.apnsID(for: "d-1"))
        #expect(try await client.send(RedisCommand("GET", ["apns-relay:seen:{\(hexToken(1))}:com.example.app:d-1"])).string
            == "2 delivered 200 - \(apnsID) -")
        let ttl = try #require(try await client.send(RedisCommand("TTL", ["apns-relay:seen:{\(hexToken(1))}:com.example.app:d-1"])).integer)
        #expect(ttl > 3500 && ttl <= 3600)
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Three copies consumed in one batch, while the first is with APNs (300 ms): the other two
    /// are answered from the copy in flight, not from Redis' record (which holds no answer
    /// yet): their outcomes carry no original answer.
    @Test func copiesInFlightTogetherAreSentOnce() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, simulator: { $0.behaviour.latency = .milliseconds(300) },
                                             preload: (0..<3).map { _ in (intent("same", token: hexToken(7)), hexToken(7)) })
        let outcomes = try await harness.outcomes(count: 3)
        #expect(outcomes.compactMap { $0["status"] as? String }.sorted() == ["delivered", "duplicate", "duplicate"])
        for copy in outcomes where copy["status"] as? String == "duplicate" {
            #expect(copy["original_status"] is NSNull && copy["http_status"] is NSNull, "\(copy)")
        }
        #expect(harness.simulator.accepted.count == 1)
        #expect(try await harness.stopExpectingOneOutcomeEach().count == 3)
    }

    @Test func failedIntentsAreNotRecorded() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis)
        // No credentials for this topic: `failed`, and a later copy is tried again.
        let other = #"{"id":"nc","token":"\#(hexToken(8))","topic":"com.other.app","payload":{"aps":{}}}"#
        try await harness.produce(other, key: hexToken(8))
        _ = try await harness.outcomes(count: 1)
        try await harness.produce(other, key: hexToken(8))
        let statuses = try await harness.outcomes(count: 2).compactMap { $0["status"] as? String }
        #expect(statuses == ["failed", "failed"])
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func redisDownStopsConsumingAndNothingIsLostOrSentTwice() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis)
        try await harness.produce(intent("before", token: hexToken(1)), key: hexToken(1))
        _ = try await harness.outcomes(count: 1)
        redis.stop()
        for index in 0..<50 {
            try await harness.produce(intent("r-\(index)", token: hexToken(100 + index % 7)), key: hexToken(100 + index % 7))
        }
        try await harness.pipeline.incidents.waitUntil(timeout: .seconds(30)) { $0.redisTrouble != nil }
        #expect(harness.pipeline.dependencyProblems.contains { $0.contains("Redis unreachable") }, "\(harness.pipeline.dependencyProblems)")
        // Still ready: a Redis outage makes every relay wait at once, and unready ones would keep
        // a drain from evicting any of them.
        #expect(harness.pipeline.notReadyReason == nil)
        #expect(harness.simulator.accepted.count == 1)
        try await redis.restart()
        let outcomes = try await harness.outcomes(count: 51)
        #expect(outcomes.count == 51)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        #expect(Set(harness.simulator.accepted.map(\.apnsID)).count == 51)
        #expect(harness.simulator.accepted.count == 51)
        try await harness.pipeline.incidents.waitUntil(timeout: .seconds(10)) { $0.redisTrouble == nil }
        #expect(try await harness.stopExpectingOneOutcomeEach().count == 51)
    }

    @Test func aRedisRestartMidStreamLosesNothingAndSendsNothingTwice() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis)
        let total = 300
        let producing = Task {
            for index in 0..<total {
                let token = hexToken(500 + index % 60)
                try await harness.produce(intent("m-\(index)", token: token), key: token)
            }
        }
        // Restart Redis (empty: no persistence) while intents are flowing.
        try await harness.published.waitUntil(timeout: .seconds(30)) { $0.all.count >= 50 }
        redis.stop()
        try await harness.pipeline.incidents.waitUntil(timeout: .seconds(30)) { $0.redisTrouble != nil }
        #expect(harness.pipeline.dependencyProblems.contains { $0.contains("Redis unreachable") }, "\(harness.pipeline.dependencyProblems)")
        try await redis.restart()
        try await producing.value
        let outcomes = try await harness.outcomes(count: total)
        #expect(outcomes.count == total)
        #expect(Set(outcomes.compactMap { $0["id"] as? String }).count == total)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        #expect(harness.simulator.accepted.count == total)
        #expect(Set(harness.simulator.accepted.map(\.apnsID)).count == total)
        #expect(try await harness.stopExpectingOneOutcomeEach().count == total)
    }

    @Test func failOpenSendsWithoutPolicyWhileRedisIsDown() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, failOpen: true)
        redis.stop()
        for index in 0..<10 {
            try await harness.produce(intent("o-\(index)", token: hexToken(200 + index)), key: hexToken(200 + index))
        }
        let outcomes = try await harness.outcomes(count: 10)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        #expect(harness.pipeline.dependencyProblems.contains { $0.contains("sending without policy") })
        #expect(harness.pipeline.redisOutages == 1)

        // Redis back (empty). The outage ends with the first batch Redis answers for (the
        // client reconnects with backoff meanwhile): one intent at a time until then.
        try await redis.restart()
        var answered = 10
        while !harness.pipeline.dependencyProblems.isEmpty {
            guard answered < 40 else {
                Issue.record("the outage did not end: \(harness.pipeline.dependencyProblems)")
                break
            }
            try await harness.produce(intent("o-probe-\(answered)", token: hexToken(300 + answered)), key: hexToken(300 + answered))
            answered += 1
            _ = try await harness.outcomes(count: answered)
        }
        // Nothing of the outage is written late: no key names a device it sent to.
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let keys = try await client.send(RedisCommand("KEYS", ["apns-relay:*"])).array?.compactMap(\.string) ?? []
        let outageTokens = (0..<10).map { hexToken(200 + $0) }
        #expect(!keys.contains { key in outageTokens.contains { key.contains($0) } }, "\(keys)")
        await client.shutdown()
        // The policy is back: an intent's copy is a duplicate again, and APNs sees it once.
        let token = hexToken(290)
        for _ in 0..<2 {
            try await harness.produce(intent("o-after", token: token), key: token)
            answered += 1
            _ = try await harness.outcomes(count: answered)
        }
        let after = try await harness.outcomes(count: answered).filter { $0["id"] as? String == "o-after" }
        #expect(after.compactMap { $0["status"] as? String } == ["delivered", "duplicate"], "\(after)")
        #expect(harness.simulator.accepted.filter { $0.apnsID == APNsIdentifiers.format(Intent.apnsID(for: "o-after")) }.count == 1)
        #expect(try await harness.stopExpectingOneOutcomeEach().count == answered)
    }

    /// Review N7: Redis refuses every write (out of memory) while intents are at APNs, and a
    /// second relay joins the group. The first relay's revocation waits past its shutdown
    /// deadline (2 s) while Redis fails, so the answers it has are recorded before the partitions
    /// move: the next owner finds their records, and no intent reaches APNs twice. (A paused
    /// `redis-server` would not show it: the writes in its socket's buffer are executed when
    /// it resumes, however long ago the relay gave up on them.)
    @Test func aRedisPauseOverlappingARevocationSendsNothingTwice() async throws {
        let redis = try await RedisServerProcess.started()
        // APNs keeps its answers until every intent is there (a loaded machine may take longer
        // to send them all than a fixed latency lasts), and the relay waits for them.
        let harness = try await RelayHarness.start(configure: { $0.behaviour.holdAnswers = true }, configureRelay: {
            $0.redis.url = redis.url
            $0.redis.timeoutMilliseconds = 300 * sanitizerSlowdown
            $0.apns.requestTimeoutSeconds = 120
            $0.policy.dedupeWindowSeconds = 3600
            $0.shutdownDeadlineSeconds = 2
            // Kafka gives a member its rebalance timeout (`max.poll.interval.ms`, 5 minutes) to
            // rejoin; the mock coordinator holds every rebalance open for the session timeout
            // less a second, and evicts a member that has not rejoined by then: 9 s, for a
            // revocation that waits out the outage below.
            $0.kafka.properties["session.timeout.ms"] = "10000"
        }, shards: 3)
        let count = 300
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            let token = hexToken(0x3000 + $0)
            return (Array(token.utf8), Array(intent("n7-\($0)", token: token).utf8))
        })
        // All of them at APNs (every partition's), then Redis refuses writes, then APNs answers.
        try await waitUntil(timeout: .seconds(60)) { harness.simulator.accepted.count >= count }
        #expect(harness.pipeline.inFlight == count)
        let noRoom = try LoopbackRedisCommand.run(port: redis.port, ["CONFIG", "SET", "maxmemory", "1"])
        #expect(noRoom.hasPrefix("OK"))
        harness.simulator.releaseHeldAnswers()
        // Answers from APNs now wait for their records: Redis fails them, and at most a few
        // (recorded before the write limit took hold) have an outcome.
        try await harness.pipeline.incidents.waitUntil { $0.redisTrouble != nil }
        #expect(harness.published.value.all.count <= count - 100)
        let second = try RelayApplication(configuration: harness.configuration, worker: "second")
        let running = Task { await second.run() }
        // The outage goes on well past the revocation's usual wait (the shutdown deadline).
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.shards.contains { !$0.publishedPartitions.revoking.isEmpty } }
        try await Task.sleep(for: .seconds(4))
        #expect(try LoopbackRedisCommand.run(port: redis.port, ["CONFIG", "SET", "maxmemory", "0"]).hasPrefix("OK"))
        try await waitUntil(timeout: .seconds(90)) { Set(harness.simulator.accepted.map(\.apnsID)).count >= count }
        // The second relay took its share over and consumed it from the revocation's commit, up
        // to the end: the group committed every intent.
        try await waitUntil(timeout: .seconds(60)) { !second.pipeline.ownedPartitions.isEmpty }
        try await waitUntil(timeout: .seconds(60)) { (try? await harness.committedTotal()) == Int64(count) }
        #expect(await harness.pipeline.idle(within: .seconds(30)))
        #expect(await second.pipeline.idle(within: .seconds(30)))
        let accepted = harness.simulator.accepted.map(\.apnsID)
        let refused = harness.pipeline.revocationCommitFailures + second.pipeline.revocationCommitFailures
        let summary = "outcomes: \(harness.pipeline.outcomeCounts) and \(second.pipeline.outcomeCounts); revocation commits refused: \(refused)"
        #expect(Set(accepted).count == count, "\(summary)")
        // The mock coordinator may refuse the revocation's commit (see
        // `aRebalanceUnderLoadSendsNoIntentFromBothRelays`): a redelivery then finds its record
        // and comes out `duplicate`, it is not sent again. So every intent reaches APNs once.
        #expect(accepted.count == count, "\(accepted.count - Set(accepted).count) intents reached APNs twice; \(summary)")
        let published = (harness.pipeline.outcomeCounts.values.reduce(0, +) + second.pipeline.outcomeCounts.values.reduce(0, +))
        let outcomes = try await harness.outcomes(count: published)
        let answered = Dictionary(grouping: outcomes.filter { $0["status"] as? String != "duplicate" }) { $0["id"] as? String ?? "" }
        #expect(answered.count == count)
        #expect(answered.values.allSatisfy { $0.count == 1 }, "\(answered.filter { $0.value.count > 1 }.keys.sorted().prefix(10))")
        second.requestStop()
        await running.value
        await harness.stop()
    }

    /// The revocation's wait for Redis stays inside `max.poll.interval.ms`, past which the
    /// group would take the partitions away without their commit: 180 s with librdkafka's
    /// default (300 s), 10 s inside a lower setting.
    @Test func theRevocationsRedisWaitStaysInsideThePollInterval() {
        #expect(RevocationCoordinator.redisWaitLimit([:]) == 180)
        #expect(RevocationCoordinator.redisWaitLimit(["max.poll.interval.ms": "120000"]) == 110)
        #expect(RevocationCoordinator.redisWaitLimit(["max.poll.interval.ms": "5000"]) == 0)
        #expect(RevocationCoordinator.redisWaitLimit(["max.poll.interval.ms": "not a number"]) == 180)
    }

    @Test func outcomesWhoseDeliveryFailsAfterTheRecordArePublishedOnceKafkaTakesThem() async throws {
        let redis = try await RedisServerProcess.started()
        // Outcome records time out after 1 s while the brokers refuse them. The intents are in
        // the topic before the relay starts, and the brokers refuse records from the moment it
        // has started: before its group is even joined (and APNs takes 0.5 s more), so before
        // any outcome exists.
        let harness = try await RelayHarness.start(configure: { $0.behaviour.latency = .milliseconds(500) }, configureRelay: {
            $0.redis.url = redis.url
            $0.kafka.properties["message.timeout.ms"] = "1000"
            $0.apns.requestTimeoutSeconds = 60
        }, preload: (0..<20).map { (intent("late-\($0)", token: hexToken(700 + $0)), hexToken(700 + $0)) })
        harness.cluster.failRequests(apiKey: KafkaMockCluster.APIKey.produce, errorCode: KafkaErrorCode.notEnoughReplicas)
        try await harness.pipeline.incidents.waitUntil { $0.publishFailures >= 20 }  // every outcome failed at least once
        harness.cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.produce)
        let outcomes = try await harness.outcomes(count: 20)
        #expect(Set(outcomes.compactMap { $0["id"] as? String }).count == 20)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        #expect(harness.simulator.accepted.count == 20)
        #expect(await harness.pipeline.idle(within: .seconds(20)))
        #expect(harness.pipeline.outcomeCounts["delivered"] == 20)
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Review 2.3: a redelivered intent whose answer is recorded comes out `duplicate` with what
    /// APNs answered the first time, so a 410 (and its timestamp) is never lost behind it.
    @Test func aDuplicateCarriesTheRecordedAnswer() async throws {
        let redis = try await RedisServerProcess.started()
        let gone = hexToken(0x410)
        let harness = try await Self.harness(redis, simulator: { $0.behaviour.unregistered = [gone: 1_432_819_882_000] })
        try await harness.produce(intent("gone-1", token: gone), key: gone)
        try await harness.produce(intent("fine-1", token: hexToken(0x411)), key: hexToken(0x411))
        let first = Dictionary(uniqueKeysWithValues: try await harness.outcomes(count: 2).map { ($0["id"] as? String ?? "", $0) })
        #expect(first["gone-1"]?["status"] as? String == "unregistered")
        // A second relay in another group reads the topic again, as after lost commits.
        var configuration = harness.configuration
        configuration.kafka.groupID += "-again"
        let secondApplication = try RelayApplication(configuration: configuration, worker: "second")
        let running = Task { await secondApplication.run() }
        let again = Dictionary(uniqueKeysWithValues: try await harness.outcomes(count: 4)
            .filter { $0["worker"] as? String == "second" }.map { ($0["id"] as? String ?? "", $0) })
        let gone1 = try #require(again["gone-1"])
        #expect(gone1["status"] as? String == "duplicate")
        #expect(gone1["original_status"] as? String == "unregistered")
        #expect(gone1["http_status"] as? Int == 410)
        #expect(gone1["reason"] as? String == "Unregistered")
        #expect(gone1["unregistered_at"] as? Int == 1_432_819_882_000)
        #expect(gone1["apns_id"] as? String == first["gone-1"]?["apns_id"] as? String)
        let fine1 = try #require(again["fine-1"])
        #expect(fine1["status"] as? String == "duplicate")
        #expect(fine1["original_status"] as? String == "delivered")
        #expect(fine1["http_status"] as? Int == 200)
        #expect(fine1["reason"] as? String == "AlreadyAnswered")
        #expect(harness.simulator.accepted.count == 1)
        secondApplication.requestStop()
        await running.value
        await harness.stop()
    }

    /// A copy whose batch read Redis while its first copy was still with APNs, but that was
    /// admitted only after the first copy's answer was recorded (its batch waited for room
    /// under `limits.max_in_flight`): its read cannot have seen the record, so it is decided
    /// again in its turn and comes out `duplicate` of the first copy, never sent twice.
    @Test func aCopyReadBeforeItsFirstCopysAnswerIsNotSentTwice() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await RelayHarness.start(configure: { $0.behaviour.latency = .milliseconds(Int64(1500 * sanitizerSlowdown)) },
                                                   configureRelay: {
            TestRedis(redis).apply(to: &$0)
            $0.policy.dedupeWindowSeconds = 3600
            $0.limits.maxInFlight = 1
            $0.apns.requestTimeoutSeconds = 60
        })
        let token = hexToken(0x5A1)
        try await harness.produce(intent("first", token: token), key: token)
        try await waitUntil { harness.pipeline.inFlight == 1 }
        // Read at once; admitted once `first`, then the other device's intent, made room. The
        // other device's intent goes to the copy's partition, ahead of it: on a partition of its
        // own its batch could be admitted after the copy's, and the copy, admitted while `first`
        // is still in flight, would be answered from it (no original answer: see
        // `copiesInFlightTogetherAreSentOnce`) instead of decided again.
        try await harness.produce(intent("other", token: hexToken(0x5A2)), key: token)
        try await harness.produce(intent("first", token: token), key: token)
        let outcomes = Self.byID(try await harness.outcomes(count: 3))
        #expect(outcomes["first"]?.compactMap { $0["status"] as? String }.sorted() == ["delivered", "duplicate"], "\(outcomes)")
        #expect(outcomes["first"]?.contains { $0["original_status"] as? String == "delivered" } == true, "\(outcomes)")
        #expect(harness.simulator.accepted.count == 2)
        await harness.stop()
    }

    /// A copy decided again in its turn (its batch's read missed the first copy's end) answers
    /// for the copies consumed while it is sent: here the first copy ends `expired` (a 503, and
    /// its expiration passes before a retry: nothing recorded), the second is decided again and
    /// sent, and a third, read while the second was with APNs, comes out `duplicate` of it
    /// instead of being sent too.
    @Test func aCopyDecidedAgainAnswersForTheCopiesAfterIt() async throws {
        let redis = try await RedisServerProcess.started()
        // Past the first copy's expiration (the next whole second) by its 503's time.
        let latency = 2500 * sanitizerSlowdown
        let harness = try await RelayHarness.start(configure: {
            $0.behaviour.latency = .milliseconds(Int64(latency))
        }, configureRelay: {
            TestRedis(redis).apply(to: &$0)
            $0.policy.dedupeWindowSeconds = 3600
            $0.apns.requestTimeoutSeconds = 60
            $0.limits.maxInFlight = 1
        })
        let token = hexToken(0x5B1)
        // The relay consumes (its group joined) before the first copy's expiration starts to run.
        try await harness.produce(intent("warm-up", token: hexToken(0x5B2)), key: hexToken(0x5B2))
        _ = try await harness.outcomes(count: 1)
        harness.simulator.update { $0.failNext = (1, 503) }
        let expiring = Int(Date().timeIntervalSince1970) + 1
        try await harness.produce(intent("x", token: token, extra: #","expiration":\#(expiring)"#), key: token)
        try await waitUntil { harness.pipeline.inFlight == 1 }
        // Read while the first copy is with APNs; admitted once it ended: decided again.
        try await harness.produce(intent("x", token: token), key: token)
        // Read while the second copy is with APNs.
        do {
            try await waitUntil(timeout: .seconds(30)) { harness.simulator.accepted.count >= 2 }
        } catch {
            Issue.record("APNs answered \(harness.simulator.answers); outcomes \(harness.pipeline.outcomeCounts), \(harness.pipeline.inFlight) in flight")
            throw error
        }
        try await harness.produce(intent("x", token: token), key: token)
        let statuses = try await harness.outcomes(count: 4).filter { $0["id"] as? String == "x" }.compactMap { $0["status"] as? String }
        #expect(statuses.sorted() == ["delivered", "duplicate", "expired"], "\(statuses)")
        #expect(harness.simulator.accepted.count == 2)
        // The first copy was sent (and answered 503): the second was decided again.
        #expect(harness.simulator.answers.filter { $0.key.hasPrefix("503") }.values.reduce(0, +) == 1, "\(harness.simulator.answers)")
        await harness.stop()
    }

    @Test func everythingConsumedAgainComesOutDuplicate() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis)
        for index in 0..<100 {
            try await harness.produce(intent("again-\(index)", token: hexToken(300 + index % 13)), key: hexToken(300 + index % 13))
        }
        _ = try await harness.outcomes(count: 100)
        // A second relay in another group reads the whole topic again, as after lost commits.
        var configuration = harness.configuration
        configuration.kafka.groupID += "-again"
        let secondApplication = try RelayApplication(configuration: configuration, worker: "second")
        let second = secondApplication.pipeline
        let running = Task { await secondApplication.run() }
        let outcomes = try await harness.outcomes(count: 200)
        let fromSecond = outcomes.filter { $0["worker"] as? String == "second" }
        #expect(fromSecond.count == 100)
        #expect(fromSecond.allSatisfy { $0["status"] as? String == "duplicate" })
        #expect(harness.simulator.accepted.count == 100)
        second.requestStop()
        await running.value
        await harness.stop()
    }
}
