import Foundation
import Kafka
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// Shadow and enforce mode on the same arrivals decide the same, on a manual clock against
/// redis-server: each mode on keys of its own, enforce mode's mailboxes parked into and taken
/// from at their due times (the take answered at once), shadow mode with its note in their
/// place (``DeviceAdmission/ShadowMailbox``). Random arrival patterns: bursts and gaps, batches of
/// one to three intents of a device, collapse pairs among them, some expiring within seconds.
@Suite("Shadow and enforce decide alike", .timeLimit(.minutes(3)))
struct ShadowEquivalenceTests {
    static let topic = "com.example.app"

    enum Decided: Equatable, CustomStringConvertible {
        case send, park, coalesced, other(String)
        init(_ admission: DeviceAdmission.Admission) {
            switch admission {
            case .send: self = .send
            case .wait: self = .park
            case .coalesced: self = .coalesced
            default: self = .other("\(admission)")
            }
        }
        var description: String {
            switch self {
            case .send: "send"
            case .park: "park"
            case .coalesced: "coalesced"
            case .other(let text): text
            }
        }
    }

    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func sameDecisionsOnTheSameArrivals(seed: UInt64) async throws {
        let redis = try await RedisServerProcess.started()
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        var generator = SplitMix(seed: seed)
        var rules = RelayConfiguration.Policy.Rules()
        rules.rateLimit = .init(burst: Int(generator.next() % 3) + 1, refillPerSecond: [0.5, 1, 2, 5][Int(generator.next() % 4)])
        var shadowRules = rules
        shadowRules.mode = .shadow
        let enforce = DevicePolicy(client: client, keys: RedisKeys(prefix: "enforce:"), intentsTopic: "intents",
                                   backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        let shadow = DevicePolicy(client: client, keys: RedisKeys(prefix: "shadow:"), intentsTopic: "intents",
                                  backoffBaseMilliseconds: 1000, backoffMaximumMilliseconds: 8000)
        let partition = TopicPartition(topic: "intents", partition: 0)
        let tokens = (0..<3).map { hexToken(0x5E0 + $0) }
        // Enforce mode's mailboxes: the parked id and its due time, per device.
        var parked: [String: (id: String, due: Int64)] = [:]
        var now: Int64 = 1_732_000_000_000, offset: Int64 = 0, next = 0
        var decided = (send: 0, park: 0, coalesced: 0)
        let interval = rules.rateLimit.intervalMilliseconds
        for _ in 0..<150 {
            now += generator.next() % 3 == 0 ? Int64(generator.next() % UInt64(4 * interval)) : Int64(generator.next() % UInt64(interval / 4 + 1))
            // Enforce mode's mailbox takes due by now, at their due times, in order.
            for (token, entry) in parked.sorted(by: { $0.value.due < $1.value.due }) where entry.due <= now {
                let take = try await enforce.take(partition: partition, token: token, topic: Self.topic, id: entry.id, rules: rules, now: entry.due)
                switch take {
                case .claimed, .expired: break
                default:
                    Issue.record("seed \(seed): the take of \(entry.id) at its due time answered \(take)")
                    return
                }
                try await enforce.release(partition: partition, token: token, topic: Self.topic, id: entry.id, now: entry.due)
                parked[token] = nil
            }
            // A batch of one to three intents of one device, the last two of a collapse id now and then.
            let token = tokens[Int(generator.next() % 3)]
            var group = DeviceAdmission.Group(token: token, topic: Self.topic, rules: rules)
            let count = Int(generator.next() % 3) + 1
            var ids: [String] = [], expirations: [Int64] = []
            for _ in 0..<count {
                // Now and then one that expires within seconds: enforce mode's mailbox gives it
                // no longer, and its take then spends nothing.
                let expiration = generator.next() % 5 == 0 ? now / 1000 + Int64(generator.next() % 4) + 1 : now / 1000 + 86_400
                ids.append("i\(next)")
                expirations.append(expiration)
                _ = group.append("i\(next)", nowOrNever: false, expiration: expiration)
                next += 1
            }
            if count >= 2, generator.next() % 3 == 0 { group.collapsesInto[count - 2] = count - 1 }
            var shadowGroup = DeviceAdmission.Group(token: token, topic: Self.topic, rules: shadowRules)
            for (id, expiration) in zip(ids, expirations) { _ = shadowGroup.append(id, nowOrNever: false, expiration: expiration) }
            shadowGroup.collapsesInto = group.collapsesInto
            guard case .success(let enforced) = try await enforce.admission([group]).get(now: now).first,
                  case .success(let shadowed) = try await shadow.admission([shadowGroup]).get(now: now).first else {
                Issue.record("an admission failed")
                return
            }
            let expected = enforced.decisions.map(Decided.init), got = shadowed.decisions.map(Decided.init)
            guard expected == got else {
                Issue.record("seed \(seed), at \(now - 1_732_000_000_000) ms, \(ids) of \(token.suffix(4)): enforce \(expected), shadow \(got)")
                return
            }
            for decision in expected {
                switch decision {
                case .send: decided.send += 1
                case .park: decided.park += 1
                case .coalesced: decided.coalesced += 1
                case .other: break
                }
            }
            // Enforce mode parks what waits, into the device's mailbox.
            for (position, decision) in enforced.decisions.enumerated() where decision == .wait {
                offset += 1
                let entry = DevicePolicy.Entry(partition: 0, offset: offset, consumedAt: now, expiration: expirations[position],
                                               message: Array(intent(ids[position], token: token).utf8))
                let result = try await enforce.park(token: token, topic: Self.topic, id: ids[position], entry: entry, due: enforced.due,
                                                    now: now, tooManyRequests: false, owner: DevicePolicy.handOverOwner())
                for displaced in result.displaced {
                    try await enforce.acknowledgeDisplaced(displaced, token: token, topic: Self.topic)
                }
                parked[token] = (result.keeper, result.due)
            }
        }
        // The pattern met every decision.
        #expect(decided.send > 0 && decided.park > 0 && decided.coalesced > 0, "\(decided)")
        await client.shutdown()
    }
}
