import APNs
import Foundation
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// Intents driven by callbacks (``RelayPipeline/drivesByCallbacks``, the default) and by a task
/// each (what `bench e2e --task-per-intent` measures against it): each test runs both ways and
/// expects the same answers, once each, in each device's order, with the turns that leave the
/// callbacks (a retry's backoff, a park) included.
@Suite("Intents driven by callbacks, and by a task each", .stopsItsRelays, .timeLimit(.minutes(3)))
struct CallbackDeliveryTests {
    /// With one shard, and with three over the four partitions (two on the first): the code
    /// that runs only with one shard, and that which finishes items across shards, run whatever
    /// this machine's core count.
    @Test(arguments: [true, false], [1, 3])
    func everyIntentIsAnsweredOnceInItsDevicesOrder(byCallbacks: Bool, shards: Int) async throws {
        let gone = hexToken(0xdead)
        // The first three sends are answered 503: those intents wait and are sent again.
        let harness = try await RelayHarness.start(configure: {
            $0.behaviour.unregistered = [gone: 1_432_819_882_000]
            $0.behaviour.failNext = (count: 3, status: 503)
        }, deliveryByCallbacks: byCallbacks, shards: shards)
        #expect(harness.pipeline.shards.count == shards)
        let devices = (1...5).map { hexToken(0xC0 + $0) }
        for round in 0..<4 {
            for device in devices {
                let id = "d\(device.suffix(2))-\(round)"
                try await harness.produce(intent(id, token: device, payload: #"{"aps":{"alert":"\#(id)"}}"#), key: device)
            }
        }
        try await harness.produce(intent("gone-1", token: gone), key: gone)
        try await harness.produce(#"{"id":"broken"#, key: "x")
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 22))
        #expect(outcomes.count == 22)
        for (id, outcome) in outcomes where id.hasPrefix("d") {
            #expect(outcome["status"] as? String == "delivered", "\(id)")
        }
        #expect(outcomes["gone-1"]?["status"] as? String == "unregistered")
        #expect(outcomes.values.filter { $0["status"] as? String == "invalid" }.count == 1, "the unreadable message")
        #expect(outcomes.values.contains { ($0["attempts"] as? Int ?? 0) > 1 }, "some were sent again after a 503")
        #expect(harness.pipeline.intentsDrivenByCallbacks == (byCallbacks ? 21 : 0), "every usable intent")
        // Each device's notifications reached APNs in the order they were produced.
        for device in devices {
            let sent = harness.simulator.accepted.filter { $0.deviceToken == device }
                .map { String(decoding: $0.payload, as: UTF8.self) }
            let expected = (0..<4).map { #"{"aps":{"alert":"d\#(device.suffix(2))-\#($0)"}}"# }
            #expect(sent == expected, "\(device.suffix(2))")
        }
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Outcomes whose delivery reports come in one poll of the producer end their intents
    /// together: one offset store for all their partitions, not one per intent (200 intents
    /// for as many devices, consumed at once; the producer's `linger.ms` of a second puts their
    /// outcomes in a request or two per partition, however slowly this machine answers them).
    /// Three shards: a poll's reports name slots of every shard.
    @Test func intentsEndedByOnePollStoreTheirOffsetsOnce() async throws {
        let preload = (0..<200).map { index in
            let device = hexToken(0x1000 + index)
            return (json: intent("batch-\(index)", token: device), key: device)
        }
        let harness = try await RelayHarness.start(configureRelay: { $0.kafka.producerProperties["linger.ms"] = "1000" }, preload: preload,
                                                   shards: 3)
        let outcomes = try await harness.outcomes(count: 200)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        let stores = harness.pipeline.consumer.offsetStoreCalls
        #expect(stores * 4 <= outcomes.count, "\(stores) offset stores for \(outcomes.count) intents")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// With Redis an intent to send goes by callbacks too: its answer is recorded before its
    /// outcome goes out (a copy consumed later comes out `duplicate` with it). A 429 parks it
    /// (a turn in a task), and its device's next intent, queued behind it, parks behind it and
    /// displaces it from the mailbox, as APNs keeps the newest for a device it cannot reach.
    @Test(arguments: [true, false])
    func withRedisAnswersAreRecordedAndA429ParksWhatFollows(byCallbacks: Bool) async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.relay(redis, latency: 300, byCallbacks: byCallbacks)
        let device = hexToken(0xC9)
        try await harness.produce(intent("a", token: device), key: device)
        _ = try await harness.outcomes(count: 1)
        try await harness.produce(intent("a", token: device), key: device)
        _ = try await harness.outcomes(count: 2)
        harness.simulator.update { $0.failNext = (1, 429) }
        try await harness.produce(intent("b", token: device), key: device)
        try await harness.produce(intent("c", token: device), key: device)
        let outcomes = try await harness.outcomes(count: 4)
        let statuses = outcomes.map { "\($0["id"] as? String ?? "?"):\($0["status"] as? String ?? "?")" }
        // One device, one partition: its outcomes in the order they were published.
        #expect(statuses == ["a:delivered", "a:duplicate", "b:coalesced", "c:delivered"], "\(statuses)")
        #expect(outcomes[1]["original_status"] as? String == "delivered", "\(outcomes[1])")
        #expect(outcomes.first { $0["id"] as? String == "b" }?["superseded_by"] as? String == "c")
        #expect(harness.simulator.accepted.map(\.apnsID) == ["a", "c"].map { APNsIdentifiers.format(Intent.apnsID(for: $0)) })
        #expect(harness.pipeline.intentsDrivenByCallbacks == (byCallbacks ? 2 : 0), "a, then b (the copy is answered from its record, c parks)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// An intent of the device's other app between a parked intent and the device's next one
    /// of the parked one's app: that next one parks behind the parked one all the same (it
    /// displaces it from the mailbox), never sent before it. Queued while the first is at APNs
    /// (600 ms), all three; the first meets a 429.
    @Test(arguments: [true, false])
    func aSendOfAnotherAppBetweenDoesNotLetTheNextOneOvertakeAParkedOne(byCallbacks: Bool) async throws {
        let other = "com.example.other"
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.relay(redis, latency: 600, byCallbacks: byCallbacks) { $0.apns.credentials[0].topics.append(other) }
        let device = hexToken(0xCA)
        try await Self.nextAnswerIsA429(harness)
        try await harness.produce(intent("first", token: device), key: device)
        try await harness.produce(#"{"id":"between","token":"\#(device)","topic":"\#(other)","payload":{"aps":{"alert":"hi"}}}"#, key: device)
        try await harness.produce(intent("next", token: device), key: device)
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 4))
        #expect(outcomes["first"]?["status"] as? String == "coalesced", "\(outcomes["first"] ?? [:])")
        #expect(outcomes["first"]?["superseded_by"] as? String == "next")
        #expect(outcomes["between"]?["status"] as? String == "delivered")
        #expect(outcomes["next"]?["status"] as? String == "delivered" && outcomes["next"]?["policy_decision"] as? String == "park",
                "\(outcomes["next"] ?? [:])")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// An intent whose batch read Redis before its device's earlier intent parked, and that is
    /// admitted only after that park (one intent in flight at most: it waits for the earlier
    /// one's slot), cannot have seen the park in its read: it is decided again in its turn,
    /// parks behind the parked one and displaces it. Before, it went out at once, ahead of the
    /// parked intent and inside the device's 429 backoff, and the parked one followed it.
    @Test(arguments: [true, false])
    func anIntentReadBeforeItsDevicesParkDoesNotOvertakeTheParkedOne(byCallbacks: Bool) async throws {
        let redis = try await RedisServerProcess.started()
        // The 8 s backoff: "older" stays in the mailbox until "newer" was decided, however slow
        // the machine ("newer" is consumed while "older" is at APNs, so its read comes first).
        let harness = try await Self.relay(redis, latency: 300, byCallbacks: byCallbacks) { $0.limits.maxInFlight = 1 }
        let device = hexToken(0xCB)
        try await Self.nextAnswerIsA429(harness)
        try await harness.produce(intent("older", token: device), key: device)
        try await harness.produce(intent("newer", token: device), key: device)
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 3))
        #expect(outcomes["older"]?["status"] as? String == "coalesced", "\(outcomes["older"] ?? [:])")
        #expect(outcomes["older"]?["superseded_by"] as? String == "newer")
        #expect(outcomes["newer"]?["status"] as? String == "delivered", "\(outcomes["newer"] ?? [:])")
        #expect(await harness.pipeline.idle(within: .seconds(20)))
        let sent = harness.simulator.accepted.filter { $0.deviceToken == device }.map(\.apnsID)
        #expect(sent == [APNsIdentifiers.format(Intent.apnsID(for: "newer"))])
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A now-or-never intent (expiration 0) queued behind one that parks cannot wait: it ends
    /// `expired`, and its device's queue goes on behind it (the intent after it parks too, and
    /// is delivered from the mailbox).
    @Test(arguments: [true, false])
    func aNowOrNeverIntentBehindAParkedOneEndsAndTheQueueGoesOn(byCallbacks: Bool) async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await Self.relay(redis, latency: 600, byCallbacks: byCallbacks)
        let device = hexToken(0xCC)
        try await Self.nextAnswerIsA429(harness)
        try await harness.produce(intent("first", token: device), key: device)
        try await harness.produce(intent("now-or-never", token: device, extra: #","expiration":0"#), key: device)
        try await harness.produce(intent("last", token: device), key: device)
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 4))
        #expect(outcomes["now-or-never"]?["status"] as? String == "expired", "\(outcomes["now-or-never"] ?? [:])")
        #expect(outcomes["first"]?["status"] as? String == "coalesced")
        #expect(outcomes["last"]?["status"] as? String == "delivered")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A record Redis answers only past the shutdown deadline (the server stopped meanwhile):
    /// its item ends abandoned — no outcome, its offset not stored, nothing left in flight — on
    /// its shard's loop. The answer comes on the Redis client's side, off the loops, where the
    /// item's shard's state may not be touched: ended there, it stopped the relay at the state's
    /// precondition.
    @Test func aRecordAnsweredPastTheShutdownDeadlineEndsItsItemAbandoned() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: {
            $0.shutdownDeadlineSeconds = 1
            $0.redis.timeoutMilliseconds = 60_000
        }, simulator: { $0.behaviour.holdAnswers = true })
        let device = hexToken(0xAB)
        try await harness.produce(intent("late-record", token: device), key: device)
        // At APNs (admitted: Redis read), then Redis stops, then APNs answers: the record waits.
        try await waitUntil(timeout: .seconds(60)) { harness.simulator.accepted.count >= 1 }
        redis.signal(SIGSTOP)
        defer { redis.signal(SIGCONT) }
        harness.simulator.releaseHeldAnswers()
        harness.pipeline.requestStop()
        await harness.pipeline.abandoning.wait()
        redis.signal(SIGCONT)
        // The record lands now, past the deadline: its item ends, abandoned.
        try await waitUntil(timeout: .seconds(30)) { harness.pipeline.inFlight == 0 }
        await harness.running.value
        #expect(harness.pipeline.outcomeCounts.isEmpty)
        #expect(try await harness.committedTotal() == 0, "abandoned: consumed again by the next owner")
        await harness.stop()
    }

    /// A relay on `redis` whose rate limit never bites, with an 8 s backoff after a 429 (the
    /// intents produced behind the first are consumed before it ends, even where a loaded
    /// machine takes seconds to consume them), and APNs answering in `latency` ms;
    /// `byCallbacks` false runs a task per intent.
    static func relay(_ redis: RedisServerProcess, latency: Int64, byCallbacks: Bool,
                      configure: @escaping (inout RelayConfiguration) -> Void = { _ in }) async throws -> RelayHarness {
        try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: {
            $0.policy.backoffInitialSeconds = 8
            $0.policy.backoffMaxSeconds = 8
            configure(&$0)
        }, simulator: { $0.behaviour.latency = .milliseconds(latency) }, deliveryByCallbacks: byCallbacks)
    }

    /// Once the relay answered a warm-up intent (its group joined), APNs answers the next
    /// request 429.
    static func nextAnswerIsA429(_ harness: RelayHarness) async throws {
        try await harness.produce(intent("warm-up", token: hexToken(0xCF)), key: hexToken(0xCF))
        _ = try await harness.outcomes(count: 1)
        harness.simulator.update { $0.failNext = (1, 429) }
    }
}
