import APNs
import Foundation
import Kafka
import KafkaTesting
import Redis
import RedisTesting
@testable import Relay
import TestSupport
import Testing

/// `apns-relay redrive` (``Redrive``): after an APNs outage past the retry deadline, the failed
/// intents still worth sending are produced again and delivered once; expired and superseded
/// ones are reported and skipped; a second run sends nothing.
@Suite("Re-driving failed intents", .stopsItsRelays, .timeLimit(.minutes(3)))
struct RedriveTests {
    static func nowMilliseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    @Test func anOutagePastTheDeadlineIsRedrivenOnceAndASecondRunSendsNothing() async throws {
        let start = Self.nowMilliseconds()
        // APNs answers every request 500 or 503; the relay gives up after a second.
        let harness = try await RelayHarness.start(configure: { $0.behaviour.failureRate = 1 },
                                                   configureRelay: { $0.retry.deadlineSeconds = 1 })
        let hour = Int64(Date().timeIntervalSince1970) + 3600
        let soon = Int64(Date().timeIntervalSince1970) + 20
        let collapsed = hexToken(0x7d0)
        let intents: [(id: String, token: String, extra: String)] =
            (0..<5).map { ("live-\($0)", hexToken(0x7a0 + $0), #","expiration":\#(hour),"metadata":{"n":\#($0)}"#) }
            + [("short", hexToken(0x7b0), #","expiration":\#(soon)"#),
               ("score-old", collapsed, #","expiration":\#(hour),"collapse_id":"score""#),
               ("score-new", collapsed, #","expiration":\#(hour),"collapse_id":"score""#),
               ("now-or-never", hexToken(0x7c0), #","expiration":0"#)]
        for item in intents {
            try await harness.produce(intent(item.id, token: item.token, extra: item.extra), key: item.token)
        }
        try await harness.published.waitUntil(timeout: .seconds(60)) { $0.all.count == intents.count }
        #expect(harness.published.value.all.allSatisfy { $0.status == .failed || $0.status == .expired }, "\(harness.published.value)")
        harness.simulator.update { $0.failureRate = 0 }

        var filter = RedriveFilter(since: start - 1000)
        filter.reasonPrefix = nil
        // Thirty seconds on: the "short" intent's expiration has passed by then. (The now-or-never
        // one came out `expired`, which the default filter does not take.)
        let later = Self.nowMilliseconds() + 30_000
        func redrive() -> Redrive {
            var redrive = Redrive(configuration: harness.configuration, filter: filter)
            redrive.seeksByTime = false
            return redrive
        }
        var dryRun = redrive()
        dryRun.dryRun = true
        let preview = try await dryRun.run(now: later)
        #expect(preview.redriven == 6 && preview.skipped == [.expired: 1, .superseded: 1], "\(preview.summary(dryRun: true))")

        let first = try await redrive().run(now: later)
        #expect(first.redriven == 6 && first.skipped == [.expired: 1, .superseded: 1], "\(first.summary(dryRun: false))")
        let redriven = Set(first.decisions.filter { $0.skipped == nil }.map(\.outcome.id))
        #expect(redriven == ["live-0", "live-1", "live-2", "live-3", "live-4", "score-new"])
        try await harness.published.waitUntil(timeout: .seconds(60)) { $0.count("delivered") == 6 }
        // Each once at APNs, each outcome naming its re-drive (and keeping its metadata).
        for id in redriven {
            #expect(harness.simulator.accepted.filter { $0.apnsID == APNsIdentifiers.format(Intent.apnsID(for: id)) }.count == 1, "\(id)")
        }
        let delivered = harness.published.value.all.filter { $0.status == .delivered }
        for outcome in delivered {
            let redrive = try #require(outcome.redrive.flatMap { try? JSONSerialization.jsonObject(with: Data($0)) as? [String: Any] })
            #expect(redrive["lane"] as? String == harness.intentsTopic && redrive["at"] as? Int == Int(later), "\(redrive)")
            #expect(outcome.offset != redrive["offset"] as? Int64, "the outcome names the re-driven record")
        }
        #expect(delivered.first { $0.id == "live-3" }.flatMap { $0.metadata.map { String(decoding: $0, as: UTF8.self) } } == #"{"n":3}"#)

        // A second run: every one answered since, nothing produced.
        let second = try await redrive().run(now: later)
        #expect(second.redriven == 0 && second.skipped == [.answered: 6, .expired: 1, .superseded: 1], "\(second.summary(dryRun: false))")
        // The now-or-never one came out expired: asked for, it is counted, never re-driven.
        var expired = filter
        expired.statuses = ["expired"]
        var counting = Redrive(configuration: harness.configuration, filter: expired)
        counting.seeksByTime = false
        let counted = try await counting.run(now: later)
        #expect(counted.redriven == 0 && counted.skipped == [.expired: 1], "\(counted.summary(dryRun: false))")
        _ = try await harness.stopExpectingOneOutcomeEach()
    }

    /// With Redis, a run marks what it produced: a second run before the relays answered the
    /// first's intents skips them (`redriven`), and an intent whose dedupe record says it was
    /// answered is skipped too (`answered`). Outcomes and intents written here stand for a
    /// relay's.
    @Test func withRedisASecondRunBeforeTheAnswersProducesNothing() async throws {
        let redis = try await RedisServerProcess.started()
        let cluster = try KafkaMockCluster(brokers: 1)
        let suffix = UUID().uuidString.prefix(8)
        var configuration = RelayConfiguration()
        configuration.kafka.brokers = cluster.bootstrapServers
        configuration.kafka.intentsTopic = "apns.intents.\(suffix)"
        configuration.kafka.outcomesTopic = "apns.outcomes.\(suffix)"
        configuration.redis.url = redis.url
        try cluster.createTopic(configuration.kafka.intentsTopic, partitions: 2)
        try cluster.createTopic(configuration.kafka.outcomesTopic, partitions: 2)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        let now = Self.nowMilliseconds()
        let expiration = now / 1000 + 3600
        for index in 0..<4 {
            let token = hexToken(0x7e0 + index)
            let landed = try await producer.send(topic: configuration.kafka.intentsTopic, key: Array(token.utf8),
                                                 value: Array(intent("i-\(index)", token: token, extra: #","expiration":\#(expiration)"#).utf8))
            var outcome = Outcome(id: "i-\(index)", token: token, topic: "com.example.app", status: .failed, reason: "RetryDeadline: ServiceUnavailable",
                                  lane: configuration.kafka.intentsTopic, partition: landed.partition, offset: landed.offset, worker: "w", at: now)
            outcome.attempts = 3
            _ = try await producer.send(topic: configuration.kafka.outcomesTopic, key: Array(token.utf8), value: outcome.utf8)
        }
        // i-3 was answered since (by a relay that found it elsewhere): its dedupe record says so.
        let client = try RedisClient(configuration: RedisConfiguration(url: RedisURL(parsing: redis.url)))
        _ = try await client.send(RedisCommand("SET", [RedisKeys.standard.seen(token: hexToken(0x7e3), topic: "com.example.app", id: "i-3"), "delivered"]))
        // The command, in a dry run: what it would do, one JSON line each; and a bad filter.
        let config = TestFiles.path("redrive-\(suffix).yaml").path
        try """
            kafka: {brokers: "\(cluster.bootstrapServers)", intents_topic: \(configuration.kafka.intentsTopic), outcomes_topic: \(configuration.kafka.outcomesTopic)}
            redis: {url: "\(redis.url)"}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        let preview = try await RelayBinary.run(["redrive", "--config", config, "--since", "1h", "--from-start", "--dry-run"])
        #expect(preview.status == 0, "\(preview.stdout)")
        let lines = preview.stdout.split(separator: "\n").map(String.init)
        #expect(lines.filter { $0.contains(#""action":"would_redrive""#) }.count == 3, "\(lines)")
        #expect(lines.filter { $0.contains(#""action":"skip","reason":"answered""#) }.count == 1, "\(lines)")
        // The exit codes docs/commands.md gives: 2 for a selection that cannot be re-driven, 64
        // for arguments the parser refuses.
        #expect(try await RelayBinary.run(["redrive", "--config", config, "--since", "1h", "--status", "delivered"]).status == 2)
        #expect(try await RelayBinary.run(["redrive", "--config", config, "--since", "1h", "--until", "2h"]).status == 2)
        #expect(try await RelayBinary.run(["redrive", "--config", config, "--since", "1h", "--lane", "not.a.lane"]).status == 2)
        #expect(try await RelayBinary.run(["redrive", "--config", config]).status == 64)
        #expect(try await RelayBinary.run(["redrive", "--config", config, "--since", "soon"]).status == 64)

        var redrive = Redrive(configuration: configuration, filter: RedriveFilter(since: now - 60_000))
        redrive.seeksByTime = false
        let first = try await redrive.run()
        #expect(first.redriven == 3 && first.skipped == [.answered: 1], "\(first.summary(dryRun: false))")
        let second = try await redrive.run()
        #expect(second.redriven == 0 && second.skipped == [.redriven: 3, .answered: 1], "\(second.summary(dryRun: false))")
        // What the first run produced: each intent once more, marked, with its original's place.
        let reader = try KafkaTopicReader(bootstrapServers: cluster.bootstrapServers, topic: configuration.kafka.intentsTopic)
        let records = try await reader.readToEnd(timeout: .seconds(30))
        await reader.close()
        let again = records.filter { $0.header(Redrive.header)?.value != nil }
        #expect(again.count == 3)
        for record in again {
            let parsed = try Intent.parse(record.value, key: record.key, now: now / 1000, defaultTTL: 86_400)
            let redrive = try #require(parsed.redrive.flatMap { try? JSONSerialization.jsonObject(with: Data($0)) as? [String: Any] })
            let original = try #require(records.first { $0.partition == redrive["partition"] as? Int32 && $0.offset == redrive["offset"] as? Int64 })
            #expect(try Intent.parse(original.value, key: original.key, now: now / 1000, defaultTTL: 86_400).id == parsed.id)
            #expect(record.partition == original.partition, "produced to its original's partition")
            #expect(record.header(Redrive.header)?.value.map { String(decoding: $0, as: UTF8.self) }
                    == "\(configuration.kafka.intentsTopic)/\(original.partition)/\(original.offset)")
        }
        await producer.close()
        await client.shutdown()
    }
}
