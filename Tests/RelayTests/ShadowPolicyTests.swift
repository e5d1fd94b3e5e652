import Foundation
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `policy.mode: shadow`: every decision taken and named as in enforce mode, every intent sent
/// as with the policy off.
@Suite("Shadow policy", .stopsItsRelays, .timeLimit(.minutes(3)))
struct ShadowPolicyTests {
    /// One batch: four intents for one device under a burst of 2 and a token a second (two go
    /// out; of the two that cannot, the older collapses into the newer, which parks and goes out
    /// from the mailbox in enforce mode), and a collapse pair for another device.
    static func batch() -> [(json: String, key: String)] {
        let device = hexToken(0x5A1), other = hexToken(0x5A2)
        return (1...4).map { (intent("a\($0)", token: device), device) }
            + [(intent("c1", token: other, extra: #","collapse_id":"score""#), other),
               (intent("c2", token: other, extra: #","collapse_id":"score""#), other)]
    }

    static func run(_ mode: RelayConfiguration.Policy.Mode) async throws -> (outcomes: [String: [String: Any]], sent: Int) {
        let redis = try await RedisServerProcess.started()
        let harness = try await PolicyTests.harness(redis, burst: 2, refill: 1, configure: { $0.policy.defaults.mode = mode },
                                                    preload: batch())
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 6))
        let sent = harness.simulator.accepted.count
        try await harness.stopExpectingOneOutcomeEach()
        return (outcomes, sent)
    }

    @Test func shadowTakesEnforcesDecisionsAndSendsEverything() async throws {
        let enforced = try await Self.run(.enforce)
        let shadowed = try await Self.run(.shadow)
        let expected = ["a1": "send", "a2": "send", "a3": "coalesce", "a4": "park", "c1": "coalesce", "c2": "send"]
        for (id, decision) in expected {
            #expect(enforced.outcomes[id]?["policy_decision"] as? String == decision, "enforce \(id): \(enforced.outcomes[id] ?? [:])")
            #expect(shadowed.outcomes[id]?["policy_decision"] as? String == decision, "shadow \(id): \(shadowed.outcomes[id] ?? [:])")
            #expect(shadowed.outcomes[id]?["status"] as? String == "delivered", "shadow \(id)")
        }
        #expect(enforced.outcomes["c1"]?["status"] as? String == "coalesced")
        #expect(enforced.outcomes["a3"]?["status"] as? String == "coalesced" && enforced.outcomes["a4"]?["status"] as? String == "delivered")
        #expect(enforced.sent == 4, "enforce sends a1, a2, c2, and a4 from the mailbox")
        #expect(shadowed.sent == 6)
    }

    /// Switching from shadow to enforce under traffic (a relay in each mode in turn, as a
    /// rollout or a reload makes it): no intent lost, none sent twice. What shadow mode wrote
    /// (dedupe records among it) is what enforce mode reads, so an intent the shadow relay sent
    /// and the enforcing one gets again (its offset not committed yet) comes out `duplicate`.
    @Test func switchingToEnforceUnderTrafficLosesAndRepeatsNothing() async throws {
        let redis = try await RedisServerProcess.started()
        // APNs takes 100 ms a request: the shadow relay has intents under way when it stops.
        let shadow = try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: { $0.policy.defaults.mode = .shadow },
                                                   simulator: { $0.behaviour.latency = .milliseconds(100) })
        let count = 300
        func produce(_ range: Range<Int>) async throws {
            for start in stride(from: range.lowerBound, to: range.upperBound, by: 10) {
                _ = try await shadow.producer.send(topic: shadow.intentsTopic, records: (start..<min(start + 10, range.upperBound)).map {
                    let token = hexToken(0x6000 + $0)
                    return (Array(token.utf8), Array(intent("switch-\($0)", token: token).utf8))
                })
            }
        }
        try await produce(0..<150)
        try await shadow.published.waitUntil(timeout: .seconds(60)) { $0.all.count >= 50 }
        var enforcing = shadow.configuration
        enforcing.policy.defaults.mode = .enforce
        let enforcer = try RelayApplication(configuration: enforcing, worker: "enforcing")
        let running = Task { await enforcer.run() }
        // The shadow relay drains and leaves with intents under way; the enforcing one takes
        // every partition, and the rest of the traffic (produced once the shadow relay is gone:
        // a poll under way when it was asked to stop may still take records produced then).
        shadow.pipeline.requestStop()
        await shadow.running.value
        try await produce(150..<count)
        try await waitUntil(timeout: .seconds(90)) {
            Set(shadow.simulator.accepted.map(\.apnsID)).count >= count
        }
        // The enforcing relay took over: its outcomes follow its sends (published once APNs
        // answered, so not always by the time the last send was taken).
        try await waitUntil(timeout: slowed(.seconds(30))) { enforcer.pipeline.outcomeCounts.values.reduce(0, +) > 0 }
        let accepted = shadow.simulator.accepted.map(\.apnsID)
        #expect(accepted.count == count, "\(accepted.count - Set(accepted).count) intents reached APNs twice")
        enforcer.requestStop()
        await running.value
        // Every intent answered once (a redelivered one may add a `duplicate`).
        let log = try await OutcomeLog.read(shadow.cluster.bootstrapServers, shadow.outcomesTopic)
        var answers: [String: [String]] = [:]
        for outcome in log.outcomes {
            guard let id = outcome["id"] as? String, let status = outcome["status"] as? String else { continue }
            answers[id, default: []].append(status)
        }
        #expect(answers.count == count)
        // What keeps a redelivery of the shadow relay's intents from going out again: their
        // dedupe records, which shadow mode writes as enforce mode does.
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let shadowSent = log.outcomes.filter { $0["worker"] as? String != "enforcing" }.compactMap { $0["id"] as? String }
        #expect(!shadowSent.isEmpty)
        for id in shadowSent.prefix(20) {
            let token = hexToken(0x6000 + Int(id.dropFirst("switch-".count))!)
            #expect(try await client.send(RedisCommand("EXISTS", [RedisKeys.standard.seen(token: token, topic: "com.example.app", id: id)])).integer == 1, "\(id)")
        }
        await client.shutdown()
        #expect(answers.values.allSatisfy { $0.filter { $0 != "duplicate" } == ["delivered"] }, "\(answers.filter { $0.value.filter { $0 != "duplicate" } != ["delivered"] })")
        await shadow.stop()
    }

    /// The Live Activity budgets in shadow mode: spent and counted, never acted on — every
    /// update goes out at priority 10 and every start at once.
    @Test func shadowLeavesLiveActivityPushesAsTheyCame() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await PolicyTests.harness(redis, burst: 1000, refill: 1000, configure: {
            $0.policy.defaults.mode = .shadow
            $0.policy.defaults.liveActivity.priority10PerHour = 2
            $0.policy.defaults.liveActivity.startsPerWindow = 1
        })
        let activity = hexToken(0x5B1), pushToStart = hexToken(0x5B2)
        for index in 0..<3 {
            try await harness.produce(LiveActivityPacingTests.start("start-\(index)", token: pushToStart), key: pushToStart)
        }
        for index in 0..<6 { try await harness.produce(LiveActivityPacingTests.update("update-\(index)", token: activity), key: activity) }
        let outcomes = try await harness.outcomes(count: 9)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" && $0["priority_downgraded"] is NSNull }, "\(outcomes)")
        #expect(harness.simulator.accepted.allSatisfy { $0.priority == 10 } && harness.simulator.accepted.count == 9)
        // The starts past the budget say what enforce mode would have done with them.
        let decisions = Dictionary(uniqueKeysWithValues: outcomes.compactMap { outcome in
            (outcome["id"] as? String).map { ($0, outcome["policy_decision"] as? String ?? "") }
        })
        #expect(decisions.filter { $0.key.hasPrefix("start-") && $0.value == "park" }.count == 2, "\(decisions)")
        #expect(decisions.filter { $0.key.hasPrefix("update-") }.allSatisfy { $0.value == "send" }, "\(decisions)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// A 429 in shadow mode: enforce mode would have parked the intent and backed its device
    /// off. The intent is retried and delivered as with the policy off, its outcome says `park`,
    /// and the device's backoff moves in Redis as enforce mode's park moves it, so that the next
    /// intent during the backoff is decided `park` as enforce mode would (and sent all the same).
    @Test func aTooManyRequestsIsDecidedAsEnforceModeWouldAndRetried() async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await PolicyTests.harness(redis, burst: 100, refill: 100, configure: {
            $0.policy.defaults.mode = .shadow
            $0.policy.backoffInitialSeconds = 30
            $0.policy.backoffMaxSeconds = 60
        })
        let device = hexToken(0x5C1)
        try await harness.produce(intent("first", token: device), key: device)
        _ = try await harness.outcomes(count: 1)
        // APNs answers the device's next request 429 TooManyRequests (as past its rate; a
        // rate per second would depend on how soon the second follows the first).
        harness.simulator.update { $0.failNext = (1, 429) }
        try await harness.produce(intent("second", token: device), key: device)
        var outcomes = PolicyTests.byID(try await harness.outcomes(count: 2))
        #expect(outcomes["first"]?["policy_decision"] as? String == "send")
        #expect(outcomes["second"]?["status"] as? String == "delivered" && outcomes["second"]?["policy_decision"] as? String == "park",
                "\(outcomes["second"] ?? [:])")
        #expect((outcomes["second"]?["attempts"] as? Int ?? 0) >= 2, "retried after its 429")
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let backoff = try await client.send(RedisCommand("GET", [RedisKeys.standard.backoff(token: device)])).string
        let until = try #require(backoff.flatMap { Int64($0.split(separator: " ").first ?? "") }, "no backoff written")
        #expect(until > Int64(Date().timeIntervalSince1970 * 1000) + 20_000, "\(backoff ?? "")")
        await client.shutdown()
        // During the backoff: decided `park`, sent.
        try await harness.produce(intent("third", token: device), key: device)
        outcomes = PolicyTests.byID(Array(try await harness.outcomes(count: 3).suffix(1)))
        #expect(outcomes["third"]?["status"] as? String == "delivered" && outcomes["third"]?["policy_decision"] as? String == "park",
                "\(outcomes["third"] ?? [:])")
        try await harness.stopExpectingOneOutcomeEach()
    }
}
