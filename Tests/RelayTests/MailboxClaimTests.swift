import APNs
import Foundation
import Redis
@testable import Relay
import RedisTesting
import TestSupport
import Testing

/// A mailbox claim whose relay died (or whose take's answer was lost, as in a Redis failover)
/// with an intent parked behind it.
@Suite("Abandoned mailbox claims", .timeLimit(.minutes(3)))
struct MailboxClaimTests {
    /// The claim's lease ran out. Whichever of the two members the relay's poll meets first —
    /// the parked entry's (`a-…`, first by name) or the claim's — the claimed intent is answered,
    /// then the parked one goes out, in that order, within seconds (not at the end of a second
    /// lease).
    @Test(arguments: [("a-parked", "b-claimed"), ("b-parked", "a-claimed")])
    func theAbandonedClaimIsAnsweredThenTheEntryBehindIt(parked: String, claimed: String) async throws {
        let redis = try await RedisServerProcess.started()
        let harness = try await MailboxRepairTests.pollingRelay(redis)
        let token = hexToken(0x4c), topic = "com.example.app"
        let now = MailboxRepairTests.nowMilliseconds()
        let expiration = now / 1000 + 3600
        let mailbox = RedisKeys.standard.mailbox(token: token, topic: topic)
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        let due = RedisKeys.standard.due(intentsTopic: harness.intentsTopic, partition: 0)
        _ = try await client.pipeline([
            RedisCommand("HSET", [mailbox,
                                  "cid", claimed, "c", MailboxRepairTests.entry(intent(claimed, token: token), expiration: expiration),
                                  "ce", expiration, "cu", now - 1,
                                  "pid", parked, "p", MailboxRepairTests.entry(intent(parked, token: token), expiration: expiration),
                                  "pe", expiration, "pd", 0]),
            RedisCommand("SET", [RedisKeys.standard.waiting(token: token, topic: topic), "\(parked.utf8.count):\(parked)\(claimed)"]),
            RedisCommand("ZADD", [due, 0, RedisKeys.member(token: token, topic: topic, id: claimed),
                                  0, RedisKeys.member(token: token, topic: topic, id: parked)]),
        ])
        let outcomes = try await harness.outcomes(count: 3, timeout: .seconds(30))
        let byID = PolicyTests.byID(outcomes)
        #expect(byID[claimed]?["status"] as? String == "delivered")
        #expect(byID[parked]?["status"] as? String == "delivered")
        #expect(PolicyTests.sent(harness, claimed) == 1 && PolicyTests.sent(harness, parked) == 1)
        let order = harness.simulator.accepted.map(\.apnsID).filter {
            [claimed, parked].map { APNsIdentifiers.format(Intent.apnsID(for: $0)) }.contains($0)
        }
        #expect(order == [claimed, parked].map { APNsIdentifiers.format(Intent.apnsID(for: $0)) })
        // Nothing left: no claim, no parked entry, no index member.
        try await waitUntil(asking: { (try? await client.send(RedisCommand("ZCARD", [due])))?.integer == 0 })
        await harness.stop()
        await client.shutdown()
    }
}
