import APNs
import APNsSimulator
import Foundation
import NIOCore
import Redis
@testable import Relay
import TestSupport
import Testing
import RedisTesting

/// Rate limits, mailboxes and coalescing against a real redis-server, the simulator and the
/// mock Kafka cluster.
@Suite("Per-device policy: rate limit, mailboxes, coalescing", .stopsItsRelays, .timeLimit(.minutes(3)))
struct PolicyTests {
    static func harness(_ redis: RedisServerProcess, burst: Int, refill: Double,
                        configure: (inout RelayConfiguration) -> Void = { _ in },
                        simulator: (inout SimulatorConfiguration) -> Void = { _ in },
                        preload: [(json: String, key: String)] = [], deliveryByCallbacks: Bool = true) async throws -> RelayHarness {
        try await harness(TestRedis(redis), burst: burst, refill: refill, configure: configure, simulator: simulator, preload: preload,
                          deliveryByCallbacks: deliveryByCallbacks)
    }

    static func harness(_ redis: TestRedis, burst: Int, refill: Double,
                        configure: (inout RelayConfiguration) -> Void = { _ in },
                        simulator: (inout SimulatorConfiguration) -> Void = { _ in },
                        preload: [(json: String, key: String)] = [], deliveryByCallbacks: Bool = true) async throws -> RelayHarness {
        try await RelayHarness.start(configure: simulator, configureRelay: {
            redis.apply(to: &$0)
            $0.policy.defaults.rateLimit = .init(burst: burst, refillPerSecond: refill)
            $0.policy.mailboxPollMilliseconds = 100
            configure(&$0)
        }, preload: preload, deliveryByCallbacks: deliveryByCallbacks)
    }

    /// A relay with burst 1 and one token per 5 s, after `sent` went out and `parked` went into
    /// the device's mailbox (due about 5 s after `sent`).
    static func oneSentOneParked(_ redis: RedisServerProcess, token: String, sent: String, parked: String,
                                 refill: Double = 0.2) async throws -> RelayHarness {
        let harness = try await Self.harness(redis, burst: 1, refill: refill)
        try await harness.produce(intent(sent, token: token), key: token)
        try await harness.produce(intent(parked, token: token), key: token)
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        #expect(await harness.pipeline.idle(within: .seconds(20)))
        return harness
    }

    /// A relay whose own rate limit never bites, with a 1 s 429 backoff (up to `backoffMax`), in
    /// front of a simulator that answers 429 past `perDevice` notifications per `window`.
    static func tooManyRequests(_ redis: RedisServerProcess, perDevice: Int, window: TimeAmount,
                                backoffMax: Int64) async throws -> RelayHarness {
        try await harness(redis, burst: 100, refill: 100, configure: {
            $0.policy.backoffInitialSeconds = 1
            $0.policy.backoffMaxSeconds = backoffMax
        }, simulator: {
            $0.behaviour.rateLimitPerDevice = perDevice
            $0.behaviour.rateLimitWindow = window
        })
    }

    static func byID(_ outcomes: [[String: Any]]) -> [String: [String: Any]] {
        Dictionary(outcomes.map { ($0["id"] as? String ?? "", $0) }, uniquingKeysWith: { first, _ in first })
    }

    static func sent(_ harness: RelayHarness, _ id: String) -> Int {
        harness.simulator.accepted.filter { $0.apnsID == APNsIdentifiers.format(Intent.apnsID(for: id)) }.count
    }

    /// When a device's head intent parks (its retries ran past the deadline), the intents queued
    /// behind it for the same device and app do not overtake it: they park too, and the newest
    /// goes out from the mailbox. No older notification is accepted after a newer one, and the
    /// badge never goes backwards.
    @Test func intentsQueuedBehindAParkedOneDoNotOvertakeIt() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, burst: 10, refill: 10, configure: {
            $0.retry.deadlineSeconds = 1
            $0.retry.initialBackoffMilliseconds = 100
            $0.retry.maxBackoffMilliseconds = 3000
        })
        try await harness.produce(intent("warm-up", token: hexToken(1)), key: hexToken(1))
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        // APNs fails every request (500 or 503) until an intent parked.
        harness.simulator.update { $0.failureRate = 1 }
        let token = hexToken(0x77)
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: ["older", "newer", "newest"].map {
            (Array(token.utf8), Array(intent($0, token: token, extra: #","badge":{"increment":1}"#).utf8))
        })
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: "com.example.app")
        // The first parked after its retry deadline (and the others behind it, at once, with the fix).
        try await waitUntil(timeout: .seconds(30), asking: { (try? await client.send(RedisCommand("HGET", [mailbox, "pid"])))?.string != nil })
        harness.simulator.update { $0.failureRate = 0 }
        try await harness.published.waitUntil(timeout: .seconds(30)) { published in
            ["older", "newer", "newest"].allSatisfy { id in published.all.contains { $0.id == id } }
        }
        let accepted = harness.simulator.accepted.filter { $0.deviceToken == token }
        let order = accepted.compactMap { notification in
            ["older", "newer", "newest"].first { APNsIdentifiers.format(Intent.apnsID(for: $0)) == notification.apnsID }
        }
        let badges = accepted.compactMap { notification -> Int? in
            let object = try? JSONSerialization.jsonObject(with: Data(notification.payload)) as? [String: Any]
            return (object?["aps"] as? [String: Any])?["badge"] as? Int
        }
        #expect(order == order.sorted { ["older", "newer", "newest"].firstIndex(of: $0)! < ["older", "newer", "newest"].firstIndex(of: $1)! },
                "accepted out of order: \(order)")
        #expect(badges == badges.sorted() && badges.last == 3, "badges as accepted: \(badges)")
        #expect(order.last == "newest", "\(order)")
        let statuses = harness.published.value.all.filter { $0.token == token }.map { "\($0.id ?? "?"): \($0.status.rawValue)" }
        #expect(Set(statuses).count == 3, "one outcome each: \(statuses)")
        await harness.stop()
        await client.shutdown()
    }

    @Test(arguments: RedisKind.allCases)
    func aBurstAtOneDeviceSendsTheBurstThenOnlyTheNewest(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let token = hexToken(0xb0)
        let harness = try await Self.harness(redis, burst: 5, refill: 0.5,
                                             preload: (1...20).map { (intent("burst-\($0)", token: token), token) })
        let outcomes = try await harness.outcomes(count: 20)
        let byID = Self.byID(outcomes)
        #expect(byID.count == 20)
        for index in 1...5 {
            #expect(byID["burst-\(index)"]?["status"] as? String == "delivered", "burst-\(index)")
        }
        for index in 6...19 {
            let outcome = try #require(byID["burst-\(index)"])
            #expect(outcome["status"] as? String == "coalesced", "burst-\(index)")
            #expect(outcome["reason"] as? String == "Superseded")
            #expect(outcome["attempts"] as? Int == 0)
            #expect(outcome["token"] as? String == token)
            let newer = try #require(outcome["superseded_by"] as? String)
            #expect(Int(newer.dropFirst("burst-".count))! > index)
        }
        // The newest waited in the mailbox until the bucket had a token again: 2 s per token, the
        // sixth due 2 s after the burst, which the whole batch was consumed with (100 ms for
        // the clock's milliseconds and the decision's own time).
        let newest = try #require(byID["burst-20"])
        #expect(newest["status"] as? String == "delivered")
        #expect(newest["superseded_by"] is NSNull)
        #expect((newest["latency_ms"] as? Int ?? 0) >= 1900, "\(newest)")
        #expect(harness.simulator.accepted.count == 6)
        #expect(Self.sent(harness, "burst-20") == 1)
        // Once answered, nothing is left in the mailbox or in the partition's due index.
        #expect(await harness.pipeline.idle(within: .seconds(20)))
        let client = try redis.client()
        #expect(try await client.send(RedisCommand("HLEN", ["apns-relay:mailbox:{\(token)}:com.example.app"])).integer == 0)
        #expect(try await client.send(RedisCommand("EXISTS", ["apns-relay:waiting:{\(token)}:com.example.app"])).integer == 0)
        let indexes = try await client.onEveryNode([RedisCommand("KEYS", ["apns-relay:due:*"])]).flatMap { $0.replies[0].array ?? [] }
        for index in indexes {
            #expect(try await client.send(RedisCommand("ZCARD", [index.string ?? ""])).integer == 0, "\(index)")
        }
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func anIntentExpiringWhileParkedComesOutExpired() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, burst: 1, refill: 0.001)
        let token = hexToken(0xe1)
        try await harness.produce(intent("first", token: token), key: token)
        // Consuming (the group joined): it expires 8 s from now, 7 at the least after the
        // truncation to whole seconds (a loaded suite has taken over 2 s to park it).
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        let soon = Int64(Date().timeIntervalSince1970) + 8
        try await harness.produce(intent("parked", token: token, extra: #","expiration":\#(soon)"#), key: token)
        // It is in the mailbox before it expires (the admission does not look at expirations:
        // parked late, it would come out the same).
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        try await waitUntil(asking: {
            (try? await client.send(RedisCommand("HGET", ["apns-relay:mailbox:{\(token)}:com.example.app", "pid"])))?.string == "parked"
        })
        #expect(Int64(Date().timeIntervalSince1970) < soon)
        await client.shutdown()
        try await harness.produce(intent("now-or-never", token: hexToken(0xe1), extra: #","expiration":0"#), key: token)
        let byID = Self.byID(try await harness.outcomes(count: 3))
        #expect(byID["first"]?["status"] as? String == "delivered")
        let parked = try #require(byID["parked"])
        #expect(parked["status"] as? String == "expired")
        #expect(parked["reason"] as? String == "ExpiredWhileParked")
        // Answered once its expiration passed, at one of the mailbox's 100 ms polls after it (a
        // second's grace: the take answers expired from the next second on), not when the
        // device's bucket would have let it go (1,000 s away). The bound leaves a loaded
        // machine's late polls room.
        let answeredAt = parked["at"] as? Int64 ?? (parked["at"] as? Int).map(Int64.init) ?? 0
        #expect(answeredAt >= soon * 1000 && answeredAt < (soon + 30) * 1000, "\(parked)")
        #expect(parked["attempts"] as? Int == 0)
        let nowOrNever = try #require(byID["now-or-never"])
        #expect(nowOrNever["status"] as? String == "expired")
        #expect(nowOrNever["reason"] as? String == "RateLimited")
        #expect(harness.simulator.accepted.count == 1)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func intentsParkedAcrossARestartAreDeliveredOnceAfterIt() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0x5e)
        let harness = try await Self.oneSentOneParked(redis, token: token, sent: "before", parked: "waiting")
        // Stop this relay while "waiting" sits in the mailbox (due about 5 s after "before") ...
        harness.pipeline.requestStop()
        await harness.running.value
        #expect(harness.pipeline.outcomeCounts == ["delivered": 1])
        // ... and start another one in the same group: it owns the partition now and delivers it.
        let secondApplication = try RelayApplication(configuration: harness.configuration, worker: "second")
        let second = secondApplication.pipeline
        let running = Task { await secondApplication.run() }
        let outcomes = try await harness.outcomes(count: 2)
        let waiting = try #require(Self.byID(outcomes)["waiting"])
        #expect(waiting["status"] as? String == "delivered")
        #expect(waiting["worker"] as? String == "second")
        #expect(Self.sent(harness, "waiting") == 1)
        // Consuming again from the committed offsets finds nothing more to do.
        #expect(await second.idle(within: .seconds(20)))
        #expect(second.outcomeCounts == ["delivered": 1])
        second.requestStop()
        await running.value
        await harness.stop()
    }

    @Test func a429BacksTheDeviceOffAndTheNewestIntentWaitsItOut() async throws {
        let redis = try await RedisServerProcess.started()
        // APNs allows two per second: the third meets a 429 unless it comes a second after the
        // first (a loaded machine can take half a second between them), and its retry after the
        // 1 s backoff comes in the next window.
        let harness = try await Self.tooManyRequests(redis, perDevice: 2, window: .seconds(1), backoffMax: 4)
        let token = hexToken(0x429)
        for index in 1...3 {
            try await harness.produce(intent("fast-\(index)", token: token), key: token)
        }
        let byID = Self.byID(try await harness.outcomes(count: 3))
        #expect(byID.values.allSatisfy { $0["status"] as? String == "delivered" })
        // The third met a 429, waited out the device's backoff in its mailbox, then went out.
        let third = try #require(byID["fast-3"])
        // The backoff starts at the 429, after the intent was consumed: at least 1 s.
        #expect((third["latency_ms"] as? Int ?? 0) >= 950, "\(third)")
        #expect(Self.sent(harness, "fast-3") == 1)
        #expect(harness.simulator.accepted.count == 3)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func theBackoffGrowsWhile429sRepeat() async throws {
        let redis = try await RedisServerProcess.started()
        // One notification per device per 5 s: the second one meets 429s until then. The
        // backoff's ceiling (30 s) is above every step taken here (1, 2, 4 s); it keeps the
        // backoff's key (which lives its length plus the ceiling) until it is read below, however
        // slowly a loaded machine gets there.
        let harness = try await Self.tooManyRequests(redis, perDevice: 1, window: .seconds(5), backoffMax: 30)
        let token = hexToken(0x4291)
        try await harness.produce(intent("first", token: token), key: token)
        try await harness.produce(intent("second", token: token), key: token)
        let byID = Self.byID(try await harness.outcomes(count: 2))
        // 429, 1 s backoff; 429 again, 2 s; 429 again, 4 s; then the window has passed, 5 s after
        // the first. (A mailbox poll that comes late on a loaded machine can skip a 429, never
        // the first repeat, which comes 1 s into a 5 s window.)
        let second = try #require(byID["second"])
        #expect(second["status"] as? String == "delivered")
        #expect((second["latency_ms"] as? Int ?? 0) >= 4900, "\(second)")
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        // `<until> <level>`: the backoff doubled, once or twice.
        let backoff = try await client.send(RedisCommand("GET", ["apns-relay:backoff:{\(token)}"])).string ?? ""
        #expect(["1", "2"].contains(backoff.split(separator: " ").last ?? ""), "\(backoff)")
        await client.shutdown()
        #expect(Self.sent(harness, "second") == 1)
        #expect(harness.simulator.accepted.count == 2)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func anIntentOutlastingTheRetryBudgetWaitsInItsMailboxInsteadOfFailing() async throws {
        let redis = try await RedisServerProcess.started()
        // APNs answers 503 for a while: longer than the 1 s retry budget.
        let harness = try await Self.harness(redis, burst: 10, refill: 1, configure: {
            $0.retry.deadlineSeconds = 1
        }, simulator: {
            $0.behaviour.failNext = (40, 503)
        })
        let token = hexToken(0x503)
        try await harness.produce(intent("patient", token: token), key: token)
        let outcome = try #require(try await harness.outcomes(count: 1).first)
        #expect(outcome["status"] as? String == "delivered")
        #expect((outcome["latency_ms"] as? Int ?? 0) >= 1000)
        #expect(Self.sent(harness, "patient") == 1)
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A `coalesced` answer is recorded like APNs' answers: a redelivery of the superseded
    /// intent (another batch, after a crash before the commit) comes out `duplicate` of it and
    /// is not sent after the newer one. Both ways to be superseded: collapsed in its batch, and
    /// displaced from its device's mailbox by a newer intent.
    @Test func aCoalescedIntentRedeliveredIsADuplicateNotASend() async throws {
        let redis = try await RedisServerProcess.started()
        let collapsing = hexToken(0xc1), parking = hexToken(0xc2)
        let harness = try await Self.harness(redis, burst: 1, refill: 0.01, preload: [
            (intent("score-1", token: collapsing, extra: #","collapse_id":"score""#), collapsing),
            (intent("score-2", token: collapsing, extra: #","collapse_id":"score""#), collapsing),
        ])
        try await harness.published.waitUntil { $0.all.count == 2 }
        // The device's bucket is spent: one parks, the next displaces it.
        for id in ["first", "parked", "newer"] { try await harness.produce(intent(id, token: parking), key: parking) }
        try await harness.published.waitUntil { published in published.all.contains { $0.id == "parked" } }
        let first = harness.published.value.all
        #expect(first.first { $0.id == "score-1" }?.status == .coalesced)
        #expect(first.first { $0.id == "parked" }?.status == .coalesced)
        // Each superseded intent comes again, alone in its batch.
        for (id, token) in [("score-1", collapsing), ("parked", parking)] {
            try await harness.produce(intent(id, token: token, extra: token == collapsing ? #","collapse_id":"score""# : ""), key: token)
        }
        try await harness.published.waitUntil { published in published.all.filter { ["score-1", "parked"].contains($0.id) }.count == 4 }
        for id in ["score-1", "parked"] {
            let again = try #require(harness.published.value.all.last { $0.id == id })
            #expect(again.status == .duplicate && again.originalStatus == "coalesced", "\(id): \(again.status) \(again.originalStatus ?? "-")")
            #expect(Self.sent(harness, id) == 0, "\(id) was sent after the intent that superseded it")
        }
        await harness.stop()
    }

    @Test func oneBatchCollapsesToTheNewestPerCollapseIDUnlessTheTopicSaysNo() async throws {
        for coalesce in [true, false] {
            let redis = try await RedisServerProcess.started()
            let token = hexToken(0xc0)
            let intents = (1...3).map { (intent("score-\($0)", token: token, extra: #","collapse_id":"score""#), token) }
                + [(intent("other", token: token, extra: #","collapse_id":"chat""#), token)]
            let harness = try await Self.harness(redis, burst: 100, refill: 1, configure: { configuration in
                if !coalesce {
                    var rules = configuration.policy.defaults
                    rules.coalesce = false
                    configuration.policy.topics["com.example.app"] = rules
                }
            }, preload: intents)
            let byID = Self.byID(try await harness.outcomes(count: 4))
            #expect(byID["score-3"]?["status"] as? String == "delivered")
            #expect(byID["other"]?["status"] as? String == "delivered")
            for index in 1...2 {
                let outcome = try #require(byID["score-\(index)"])
                if coalesce {
                    #expect(outcome["status"] as? String == "coalesced")
                    #expect(outcome["superseded_by"] as? String == "score-3")
                } else {
                    #expect(outcome["status"] as? String == "delivered")
                }
            }
            #expect(harness.simulator.accepted.count == (coalesce ? 2 : 4))
            try await harness.stopExpectingOneOutcomeEach()
        }
    }

    /// Review 2.5: the survivor of a collapse is one that can still be delivered. The newest of
    /// a collapse id is now-or-never and the device's bucket is empty: it expires, and the older
    /// one (with a real expiration) is parked and delivered, not `coalesced` by one that never
    /// went out.
    @Test func aCollapseNeverSettlesOnAnIntentThatIsThenDropped() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0xc5)
        let harness = try await Self.harness(redis, burst: 1, refill: 1, preload: [
            (intent("first", token: token), token),
            (intent("lasting", token: token, extra: #","collapse_id":"score""#), token),
            (intent("fleeting", token: token, extra: #","collapse_id":"score","expiration":0"#), token),
        ])
        let byID = Self.byID(try await harness.outcomes(count: 3))
        #expect(byID["first"]?["status"] as? String == "delivered")
        #expect(byID["fleeting"]?["status"] as? String == "expired")
        #expect(byID["fleeting"]?["reason"] as? String == "RateLimited")
        #expect(byID["lasting"]?["status"] as? String == "delivered")
        #expect(Self.sent(harness, "lasting") == 1)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func expirationsPastWhatTheRelayCanHoldAreAnsweredNotParkedForever() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, burst: 1, refill: 0.001)
        let token = hexToken(0xfa7)
        // The first takes the device's only token; the others would have to wait in its mailbox
        // with expirations past the year 9999 (the mailbox could not read them back) and past
        // what Redis takes as a key's lifetime.
        try await harness.produce(intent("now", token: token), key: token)
        try await harness.produce(intent("far", token: token, extra: #","expiration":300000000000"#), key: token)
        try await harness.produce(intent("farther", token: token, extra: #","expiration":9223372036854775807"#), key: token)
        let byID = Self.byID(try await harness.outcomes(count: 3))
        #expect(byID["now"]?["status"] as? String == "delivered")
        for id in ["far", "farther"] {
            #expect(byID[id]?["status"] as? String == "invalid", "\(id): \(byID[id] ?? [:])")
            #expect((byID[id]?["reason"] as? String)?.hasPrefix("BadExpirationDate") == true, "\(id)")
        }
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func keysOfAnotherTypeRefuseOneIntentsPolicyAndItGoesOnWithoutIt() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        // Keys something else wrote with other types: the mailbox scripts and the badge script
        // fail on them (WRONGTYPE) every time they are asked.
        let limited = hexToken(0x7e1), badged = hexToken(0x7e2)
        _ = try await client.send(RedisCommand("SET", ["apns-relay:mailbox:{\(limited)}:com.example.app", "a string"]))
        _ = try await client.send(RedisCommand("HSET", ["apns-relay:badge:{\(badged)}:com.example.app", "a", "hash"]))
        await client.shutdown()
        let harness = try await Self.harness(redis, burst: 1, refill: 0.001)
        try await harness.produce(intent("first", token: limited), key: limited)
        try await harness.produce(intent("second", token: limited), key: limited)  // would be parked
        try await harness.produce(intent("badge", token: badged, extra: #","badge":{"increment":1}"#), key: badged)
        let byID = Self.byID(try await harness.outcomes(count: 3))
        for id in ["first", "second", "badge"] {
            #expect(byID[id]?["status"] as? String == "delivered", "\(id): \(byID[id] ?? [:])")
        }
        #expect(byID["badge"]?["badge"] is NSNull || byID["badge"]?["badge"] == nil)
        // Not an outage: Redis is not reported as a dependency problem.
        #expect(harness.pipeline.dependencyProblems.isEmpty)

        // A due entry in that mailbox: the take is refused, asked again at the lease's end.
        let again = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let member = "\(limited) com.example.app parked"
        _ = try await again.send(RedisCommand("ZADD", ["apns-relay:due:{\(harness.intentsTopic):0}", 0, member]))
        try await waitUntil(asking: {
            (try? await again.send(RedisCommand("ZSCORE", ["apns-relay:due:{\(harness.intentsTopic):0}", member])).integer) ?? 0 > 0
        })
        #expect(harness.pipeline.dependencyProblems.isEmpty)
        await again.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Review N10: the bucket is spent by a write that is checked. A Redis that reads but cannot
    /// write (here `min-replicas-to-write` with no replica: `NOREPLICAS`, as a demoted master
    /// answers `READONLY` and a full one `OOM`) is an outage for admission: nothing goes out
    /// that the bucket did not count. Before, the bucket's write was not waited for, and the
    /// intent was sent with the rate limit silently off.
    @Test func aBucketWriteRedisRefusesHoldsTheIntentBack() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let harness = try await Self.harness(redis, burst: 1, refill: 0.01)
        // The first intent goes out while Redis writes (the provider token is minted and kept).
        try await harness.produce(intent("first", token: hexToken(0x5e1)), key: hexToken(0x5e1))
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        _ = try await client.send(RedisCommand("CONFIG", ["SET", "min-replicas-to-write", "1"]))
        try await harness.produce(intent("second", token: hexToken(0x5e2)), key: hexToken(0x5e2))
        try await waitUntil { harness.pipeline.redisOutages >= 1 }
        #expect(Self.sent(harness, "second") == 0, "sent while its bucket could not be spent")
        _ = try await client.send(RedisCommand("CONFIG", ["SET", "min-replicas-to-write", "0"]))
        try await harness.published.waitUntil(timeout: .seconds(30)) { $0.count("delivered") == 2 }
        #expect(Self.sent(harness, "second") == 1)
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func unreadablePolicyValuesInRedisDoNotStopAdmission() async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        // Whatever else wrote these keys: lengths that are negative, past the end, or overflow.
        let waiting = ["-5:x", "9223372036854775807:x", "99999999999999999999999:x", "3:ab", ":", "garbage"]
        for (index, value) in waiting.enumerated() {
            _ = try await client.send(RedisCommand("SET", ["apns-relay:waiting:{\(hexToken(0xbad0 + index))}:com.example.app", value]))
            _ = try await client.send(RedisCommand("SET", ["apns-relay:rate:{\(hexToken(0xbad0 + index))}", "not a time"]))
            _ = try await client.send(RedisCommand("SET", ["apns-relay:backoff:{\(hexToken(0xbad0 + index))}", "-1 x"]))
        }
        await client.shutdown()
        let harness = try await Self.harness(redis, burst: 5, refill: 1)
        for index in waiting.indices {
            try await harness.produce(intent("odd-\(index)", token: hexToken(0xbad0 + index)), key: hexToken(0xbad0 + index))
        }
        let outcomes = try await harness.outcomes(count: waiting.count)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" }, "\(outcomes)")
        #expect(harness.simulator.accepted.count == waiting.count)
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A claimed entry no relay can read (its stored times are not ones a relay wrote: they
    /// would overflow the arithmetic) is moved aside, out of its mailbox and the due index, and
    /// counted; it is no Redis outage, and the rest goes on. Before, it was taken again as an
    /// outage at the end of every claim's lease.
    @Test func anUnreadableMailboxEntryIsQuarantinedAndTheRestGoesOn() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, burst: 5, refill: 1)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0xbadbad)
        let keys = RedisKeys.standard, due = keys.due(intentsTopic: harness.intentsTopic, partition: 0)
        let mailbox = keys.mailbox(token: token, topic: "com.example.app")
        let stored = "0 0 -9223372036854775808 9223372036854775807\n" + intent("odd", token: token)
        _ = try await client.send(RedisCommand("HSET", [mailbox, "pid", "odd", "p", stored, "pe", "9223372036854775807", "pd", "0"]))
        _ = try await client.send(RedisCommand("SET", [keys.waiting(token: token, topic: "com.example.app"), "3:odd"]))
        _ = try await client.send(RedisCommand("ZADD", [due, 0, "\(token) com.example.app odd"]))
        let quarantine = keys.quarantine(token: token, topic: "com.example.app", id: "odd")
        try await waitUntil(asking: { (try? await client.send(RedisCommand("GET", [quarantine])))?.string == stored })
        // The member leaves the due index in the call after the quarantine's script (another
        // key's slot): waited for, not raced.
        try await waitUntil(asking: { (try? await client.send(RedisCommand("ZSCORE", [due, "\(token) com.example.app odd"])))?.isNull == true })
        #expect(try await client.send(RedisCommand("EXISTS", [mailbox, keys.waiting(token: token, topic: "com.example.app")])).integer == 0)
        #expect(try await client.send(RedisCommand("ZSCORE", [due, "\(token) com.example.app odd"])).isNull)
        let ttl = try await client.send(RedisCommand("TTL", [quarantine])).integer ?? 0
        #expect(ttl > 29 * 86_400)
        #expect(harness.pipeline.redisOutages == 0)
        try await harness.produce(intent("after", token: hexToken(0xafe)), key: hexToken(0xafe))
        let outcomes = try await harness.outcomes(count: 1)
        #expect(outcomes.first?["id"] as? String == "after")
        #expect(outcomes.first?["status"] as? String == "delivered")
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A displaced entry no relay can read, handed over by a park: moved aside as an unreadable
    /// claimed entry is. Before, every hand-over leased it again and left it
    /// unindexed, so no poll took it either: it sat in the mailbox, unanswered and unlogged,
    /// until the mailbox expired.
    @Test func anUnreadableDisplacedEntryIsQuarantinedByTheNextHandOver() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.harness(redis, burst: 1, refill: 0.01)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let token = hexToken(0xd15bad)
        let keys = RedisKeys.standard
        let mailbox = keys.mailbox(token: token, topic: "com.example.app")
        let stored = "0 0 -9223372036854775808 9223372036854775807\n" + intent("odd", token: token)
        _ = try await client.send(RedisCommand("HSET", [mailbox, "d:odd", stored, "db:odd", "newer"]))
        // The first goes out and spends the bucket; the second parks, and its park hands over.
        try await harness.produce(intent("sent", token: token), key: token)
        try await harness.produce(intent("parked", token: token), key: token)
        try await harness.published.waitUntil { $0.count("delivered") == 1 }
        let quarantine = keys.quarantine(token: token, topic: "com.example.app", id: "odd")
        try await waitUntil(asking: { (try? await client.send(RedisCommand("GET", [quarantine])))?.string == stored })
        let left = try await client.send(RedisCommand("HMGET", [mailbox, "d:odd", "db:odd", "dl:odd"])).array ?? []
        #expect(left.count == 3 && left.allSatisfy(\.isNull), "\(left)")
        #expect(try await client.send(RedisCommand("HGET", [mailbox, "pid"])).string == "parked")
        #expect(harness.pipeline.redisOutages == 0)
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach(unanswered: 1)
    }

    @Test func redeliveredParkedIntentsAreNotSentTwice() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0xd0)
        // "two" would be due 1,000 s after "one": the test makes it due once the copy is handled.
        // (Due after 10 s, it raced a loaded machine: a copy consumed after "two" left the mailbox
        // is a copy of an intent in flight, rightly `duplicate`, and this test is not about that.)
        let harness = try await Self.oneSentOneParked(redis, token: token, sent: "one", parked: "two", refill: 0.001)
        // A copy of the parked intent while it waits: it is in the mailbox already.
        try await harness.produce(intent("two", token: token), key: token)
        // `inspect` shows the parked intent, the empty bucket and the last notification sent.
        let file = TestFiles.path("policy-\(UUID()).yaml").path
        try harness.configuration.redactedYAML.write(toFile: file, atomically: true, encoding: .utf8)
        let inspected = try await RelayBinary.run(["inspect", "--config", file, "--token", token, "--topic", "com.example.app"])
        #expect(inspected.status == 0, "\(inspected.stdout)")
        let lines = inspected.stdout.split(separator: "\n")
        #expect(lines.contains { $0.hasPrefix("parked: two, due in ") && $0.contains(#""id":"two""#) }, "\(inspected.stdout)")
        #expect(lines.contains { $0.hasPrefix("bucket: 0.") && $0.contains(" of 1 tokens (refill 0.001/s)") }, "\(inspected.stdout)")
        #expect(lines.contains { $0.hasPrefix("last sent: ") && $0.contains(#""id":"one""#) }, "\(inspected.stdout)")
        #expect(lines.contains("429 backoff: none"), "\(inspected.stdout)")
        // The copy is handled (its offset committed: parked with the original), and then "two"
        // is due: a full bucket and its due-index member moved to now.
        try await waitUntil(timeout: slowed(.seconds(30)), asking: { ((try? await harness.committedTotal()) ?? 0) == 3 })
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        #expect(try await client.send(RedisCommand("DEL", [RedisKeys.standard.rate(token: token)])).integer == 1)
        let member = RedisKeys.member(token: token, topic: "com.example.app", id: "two")
        var moved: Int64 = 0
        for partition in 0..<4 {
            let due = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: Int32(partition))
            if try await !client.send(RedisCommand("ZSCORE", [due, member])).isNull {
                moved += try await client.send(RedisCommand("ZADD", [due, "XX", "CH", 0, member])).integer ?? 0
            }
        }
        #expect(moved == 1)
        await client.shutdown()
        let byID = Self.byID(try await harness.outcomes(count: 2))
        #expect(byID["one"]?["status"] as? String == "delivered")
        #expect(byID["two"]?["status"] as? String == "delivered")
        #expect(await harness.pipeline.idle(within: .seconds(20)))
        #expect(Self.sent(harness, "two") == 1)
        #expect(harness.pipeline.outcomeCounts == ["delivered": 2])
        // The copy has no outcome of its own: its id's one came when the parked intent was sent.
        try await harness.stopExpectingOneOutcomeEach(unanswered: 1)
    }

    /// Review 2.4: an intent consumed while an older one waits in its device's mailbox does not
    /// overtake it, even with a token in the bucket (its key deleted here: full again) before
    /// the older one is due. The newer takes its place in the mailbox (the older is `coalesced`
    /// by it) and goes out from there, so the device sees the two in partition order.
    @Test func aNewerIntentDoesNotOvertakeAnOlderOneWaitingInTheMailbox() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0x27)
        // "older" would be due 1,000 s after "first": "newer" is consumed before, however slow
        // the machine (due 5 s after, a loaded machine could send "older" first).
        let harness = try await Self.oneSentOneParked(redis, token: token, sent: "first", parked: "older", refill: 0.001)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        #expect(try await client.send(RedisCommand("DEL", [RedisKeys.standard.rate(token: token)])).integer == 1)
        try await harness.produce(intent("newer", token: token), key: token)
        let byID = Self.byID(try await harness.outcomes(count: 3))
        #expect(byID["first"]?["status"] as? String == "delivered")
        #expect(byID["newer"]?["status"] as? String == "delivered")
        let older = try #require(byID["older"])
        #expect(older["status"] as? String == "coalesced")
        #expect(older["superseded_by"] as? String == "newer")
        let order = harness.simulator.accepted.map(\.apnsID)
        #expect(order == ["first", "newer"].map { APNsIdentifiers.format(Intent.apnsID(for: $0)) })
        await client.shutdown()
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// An intent that comes while an older one is being sent from the mailbox waits behind that
    /// send (although the bucket has a token for it), and goes out once that send is answered,
    /// not at the end of the send's 120 s lease.
    @Test func anIntentWaitingBehindAMailboxSendGoesOutWhenThatSendIsAnswered() async throws {
        let redis = try await RedisServerProcess.started()
        let token = hexToken(0x28)
        // APNs takes 3 s to answer; the bucket has a token every 0.5 s. A minute per request: on
        // a loaded machine (under the thread sanitizer) an answer 3 s late can take past the
        // default 10 s, and "first", timed out, would be sent again before "older".
        let harness = try await Self.harness(redis, burst: 1, refill: 2, configure: { $0.apns.requestTimeoutSeconds = 60 },
                                             simulator: { $0.behaviour.latency = .seconds(3) })
        try await harness.produce(intent("first", token: token), key: token)
        try await harness.produce(intent("older", token: token), key: token)
        // "older" is sent from the mailbox; while APNs takes its time to answer, "newer" comes
        // (and finds a token in the bucket long before "older" is answered).
        try #require(await harness.simulator.waitForAnswers(atLeast: 2, within: .seconds(20)))
        #expect(Self.sent(harness, "older") == 1)
        try await harness.produce(intent("newer", token: token), key: token)
        let byID = Self.byID(try await harness.outcomes(count: 3))
        for id in ["first", "older", "newer"] { #expect(byID[id]?["status"] as? String == "delivered", "\(id)") }
        #expect((byID["newer"]?["latency_ms"] as? Int ?? .max) < 30_000)
        let order = harness.simulator.accepted.map(\.apnsID)
        #expect(order == ["first", "older", "newer"].map { APNsIdentifiers.format(Intent.apnsID(for: $0)) })
        try await harness.stopExpectingOneOutcomeEach()
    }
}
