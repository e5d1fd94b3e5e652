import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// The Live Activity budgets a device keeps and APNs never reports, paced per token in Redis:
/// the simulator counts per device what a device would have dropped.
@Suite("Live Activity budgets", .stopsItsRelays, .timeLimit(.minutes(8)))
struct LiveActivityPacingTests {
    static let topic = "com.example.app.push-type.liveactivity"

    static func update(_ id: String, token: String, priority: Int = 10) -> String {
        #"{"id":"\#(id)","token":"\#(token)","topic":"\#(topic)","push_type":"liveactivity","priority":\#(priority),"#
            + #""payload":{"aps":{"event":"update","timestamp":1732000000,"content-state":{"step":"\#(id)"}}}}"#
    }

    static func start(_ id: String, token: String, expiration: Int? = nil) -> String {
        let expires = expiration.map { #""expiration":\#($0),"# } ?? ""
        return #"{"id":"\#(id)","token":"\#(token)","topic":"\#(topic)","push_type":"liveactivity",\#(expires)"payload":{"aps":{"event":"start","#
            + #""timestamp":1732000000,"attributes-type":"Delivery","attributes":{},"content-state":{},"alert":"\#(id)"}}}"#
    }

    static func end(_ id: String, token: String) -> String {
        #"{"id":"\#(id)","token":"\#(token)","topic":"\#(topic)","push_type":"liveactivity","priority":10,"#
            + #""payload":{"aps":{"event":"end","timestamp":1732000001,"content-state":{"step":"done"},"dismissal-date":1732003600}}}"#
    }

    /// Budgets of 20 priority-10 updates an hour and 5 starts per `startWindow` seconds (2), on
    /// the relay and on the simulated device; `paced` false turns the relay's off.
    static func harness(_ redis: TestRedis, paced: Bool, startWindow: Int = 2) async throws -> RelayHarness {
        try await PolicyTests.harness(redis, burst: 100_000, refill: 10_000, configure: {
            $0.policy.defaults.liveActivity.priority10PerHour = paced ? 20 : 0
            $0.policy.defaults.liveActivity.startsPerWindow = paced ? 5 : 0
            $0.policy.defaults.liveActivity.startWindowSeconds = Int64(startWindow)
        }, simulator: {
            $0.behaviour.liveActivityBudgets = (priority10PerHour: 20, startsPerWindow: 5, startWindow: .seconds(Int64(startWindow)))
        })
    }

    /// 500 priority-10 updates to one activity and 50 push-to-starts to one token: nothing a
    /// device would drop, every intent answered — the updates past the budget at priority 5,
    /// the starts past the window from the mailbox (the newest; the others `coalesced`). On one
    /// redis-server and on a Redis Cluster (the budgets' keys live in their token's slot).
    @Test(arguments: RedisKind.allCases)
    func aBurstLeavesNothingForTheDeviceToDrop(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let harness = try await Self.harness(redis, paced: true)
        let activity = hexToken(0xA1), pushToStart = hexToken(0xA2)
        for index in 0..<50 { try await harness.produce(Self.start("start-\(index)", token: pushToStart), key: pushToStart) }
        for index in 0..<500 { try await harness.produce(Self.update("update-\(index)", token: activity), key: activity) }
        // Two devices' intents one after another each, every one a budget script's round trip
        // or two: the bound leaves a loaded machine's three cluster masters room, ten times what
        // the test takes alone.
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 550, timeout: slowed(.seconds(150))))
        #expect(outcomes.count == 550)
        let updates = outcomes.filter { $0.key.hasPrefix("update-") }.map(\.value)
        #expect(updates.allSatisfy { $0["status"] as? String == "delivered" })
        #expect(updates.filter { $0["priority_downgraded"] as? Bool == true }.count == 480)
        let starts = outcomes.filter { $0.key.hasPrefix("start-") }.map(\.value)
        let delivered = starts.filter { $0["status"] as? String == "delivered" }.count
        #expect(delivered >= 6 && delivered + starts.filter { $0["status"] as? String == "coalesced" }.count == 50, "\(delivered) delivered")
        #expect(outcomes["start-49"]?["status"] as? String == "delivered", "the newest start goes out")
        #expect(harness.simulator.droppedOnDevice.isEmpty, "\(harness.simulator.droppedOnDevice)")
        // `inspect` shows the activity's budget spent.
        let file = TestFiles.path("live-\(UUID()).yaml").path
        try harness.configuration.redactedYAML.write(toFile: file, atomically: true, encoding: .utf8)
        let inspected = try await RelayBinary.run(["inspect", "--config", file, "--token", activity, "--topic", Self.topic])
        #expect(inspected.stdout.contains("live activity: 20 of 20 priority-10 updates in the last hour"), "\(inspected.stdout)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// An activity's `end` past its priority-10 budget goes out at priority 10 (never
    /// downgraded: the activity must end now), and the device takes it; the updates past the
    /// budget before it went at priority 5.
    @Test func anEndPastTheBudgetGoesOutAsItCame() async throws {
        let redis = TestRedis(try await RedisServerProcess.started())
        let harness = try await Self.harness(redis, paced: true)
        let activity = hexToken(0xC1)
        for index in 0..<25 { try await harness.produce(Self.update("update-\(index)", token: activity), key: activity) }
        _ = try await harness.outcomes(count: 25)
        try await harness.produce(Self.end("end", token: activity), key: activity)
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 26))
        #expect(outcomes.filter { $0.value["priority_downgraded"] as? Bool == true }.count == 5)
        #expect(outcomes["end"]?["status"] as? String == "delivered" && outcomes["end"]?["priority_downgraded"] as? Bool != true, "\(outcomes["end"] ?? [:])")
        let ended = harness.simulator.accepted.filter { $0.liveActivityEvent == "end" }
        #expect(ended.map(\.priority) == [10])
        #expect(harness.simulator.droppedOnDevice.isEmpty, "\(harness.simulator.droppedOnDevice)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A push-to-start past its window waits in the mailbox, and one whose expiration comes
    /// before the window allows comes out `expired`: never a silent drop.
    @Test func aWaitingStartExpiresWithItsExpiration() async throws {
        let redis = TestRedis(try await RedisServerProcess.started())
        let harness = try await Self.harness(redis, paced: true, startWindow: 60)
        let token = hexToken(0xC2)
        for index in 0..<5 { try await harness.produce(Self.start("start-\(index)", token: token), key: token) }
        _ = try await harness.outcomes(count: 5)
        // The window opens in a minute; this start expires in 2 to 3 s.
        let expiration = Int(Date().timeIntervalSince1970) + 3
        try await harness.produce(Self.start("late", token: token, expiration: expiration), key: token)
        // It waits in the device's mailbox (then its expiration ends it there).
        let client = try redis.client()
        try await waitUntil(timeout: .seconds(30), asking: {
            (try? await client.send(RedisCommand("HGET", [RedisKeys.standard.mailbox(token: token, topic: Self.topic), "pid"])).string) == "late"
        })
        await client.shutdown()
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 6))
        #expect(outcomes["late"]?["status"] as? String == "expired", "\(outcomes["late"] ?? [:])")
        #expect(harness.simulator.accepted.filter { $0.liveActivityEvent == "start" }.count == 5)
        #expect(harness.simulator.droppedOnDevice.isEmpty, "\(harness.simulator.droppedOnDevice)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A push whose send took longer than the window and its slack (here a 503 and a retry 2.2
    /// to 4.4 s later) spent its budget when the device took it, not when the relay decided to
    /// send it: the next start, decided right after, waits its window instead of reaching the
    /// device inside the window the device counts from its arrival.
    @Test func aSlowSendSpendsItsBudgetWhenTheDeviceTakesIt() async throws {
        let redis = TestRedis(try await RedisServerProcess.started())
        let harness = try await PolicyTests.harness(redis, burst: 100_000, refill: 10_000, configure: {
            $0.policy.defaults.liveActivity.startsPerWindow = 1
            $0.policy.defaults.liveActivity.startWindowSeconds = 1
            $0.retry.initialBackoffMilliseconds = 4400
            $0.retry.maxBackoffMilliseconds = 4400
        }, simulator: {
            $0.behaviour.liveActivityBudgets = (priority10PerHour: 20, startsPerWindow: 1, startWindow: .seconds(1))
            $0.behaviour.failNext = (1, 503)
        })
        let token = hexToken(0xC3)
        try await harness.produce(Self.start("slow", token: token), key: token)
        let first = try await harness.outcomes(count: 1)
        #expect(first.first?["attempts"] as? Int == 2, "\(first)")
        try await harness.produce(Self.start("next", token: token), key: token)
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 2))
        #expect(outcomes["next"]?["status"] as? String == "delivered", "\(outcomes["next"] ?? [:])")
        #expect(harness.simulator.droppedOnDevice.isEmpty, "\(harness.simulator.droppedOnDevice)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// The same device budgets without the relay's pacing: the device drops some.
    @Test func withoutPacingTheDeviceDrops() async throws {
        let redis = TestRedis(try await RedisServerProcess.started())
        // A window longer than the burst takes on a loaded machine: 5 of the 10 starts are over.
        let harness = try await Self.harness(redis, paced: false, startWindow: 120)
        let activity = hexToken(0xB1), pushToStart = hexToken(0xB2)
        for index in 0..<10 { try await harness.produce(Self.start("start-\(index)", token: pushToStart), key: pushToStart) }
        for index in 0..<30 { try await harness.produce(Self.update("update-\(index)", token: activity), key: activity) }
        _ = try await harness.outcomes(count: 40)
        let dropped = harness.simulator.droppedOnDevice
        #expect(dropped.values.reduce(0, +) == 15, "\(dropped)")  // 10 updates and 5 starts over
        try await harness.stopExpectingOneOutcomeEach()
    }
}

/// The budget script on a manual clock, against redis-server: whatever the arrival pattern,
/// never more than the limit spent in any window, every refusal says when the window allows,
/// and an intent spends once however often it asks.
@Suite("Live Activity budget arithmetic", .timeLimit(.minutes(3)))
struct LiveActivityBudgetArithmeticTests {
    @Test(arguments: [1, 2, 3, 4, 5])
    func neverMoreThanTheLimitInAnyWindow(seed: UInt64) async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let pacer = LiveActivityPacer(client: client, keys: .standard)
        var generator = SplitMix(seed: seed)
        // Both budgets (priority-10 updates and starts), each under its own key.
        for budget in LiveActivityPacer.Budget.allCases {
            // Windows of 5 to 9 s: the key's expiry runs on Redis' clock, so a stall of a window
            // between a spend and the PERSIST after it would lose spends (a whole-suite run on
            // two loaded cores once stalled past a 1 s window); the arithmetic is the same for
            // any window.
            let limit = Int(generator.next() % 6) + 1, windowSeconds = Int64(generator.next() % 5) + 5
            let window = windowSeconds * 1000 + LiveActivityPacer.slackMilliseconds
            var now: Int64 = 1_732_000_000_000
            var spent: [Int64] = []
            for index in 0..<300 {
                // Bursts and gaps: 0 to 1.5 windows between arrivals, mostly short.
                now += generator.next() % 4 == 0 ? Int64(generator.next() % UInt64(window * 3 / 2)) : Int64(generator.next() % 50)
                let wait = try await pacer.spend(budget, token: "a1", topic: "t", intentID: "\(budget)-\(index)", limit: limit,
                                                 windowSeconds: windowSeconds, now: now)
                // The clock here is this loop's, the key's expiry Redis' own: a loaded machine's
                // stall of a window between two calls would expire spends the manual clock still
                // counts.
                _ = try await client.send(RedisCommand("PERSIST", [RedisKeys.standard.budget(token: "a1", topic: "t", kind: budget.rawValue)]))
                let inWindow = spent.filter { $0 > now - window }.count
                if let wait {
                    #expect(inWindow == limit, "refused with \(inWindow) of \(limit) spent")
                    // The oldest spend in the window leaves it exactly then.
                    #expect(spent.filter { $0 > now - window }.min().map { $0 + window - now } == wait)
                } else {
                    #expect(inWindow < limit)
                    spent.append(now)
                }
            }
            #expect(spent.count > limit)
            // Asking again for an intent that spent: it passes and spends nothing.
            let before = try await client.send(RedisCommand("ZCARD", [RedisKeys.standard.budget(token: "a1", topic: "t", kind: budget.rawValue)])).integer
            let last = "\(budget)-299"
            if spent.last == now {
                #expect(try await pacer.spend(budget, token: "a1", topic: "t", intentID: last, limit: limit, windowSeconds: windowSeconds, now: now) == nil)
                #expect(try await client.send(RedisCommand("ZCARD", [RedisKeys.standard.budget(token: "a1", topic: "t", kind: budget.rawValue)])).integer == before)
            }
        }
        await client.shutdown()
    }
}

/// A small deterministic generator (SplitMix64) for the arrival patterns.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
