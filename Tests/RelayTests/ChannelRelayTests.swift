import APNs
import Crypto
import Foundation
import Redis
import Relay
import TestSupport
import Testing

/// Intents on broadcast channels through the relay: the simulator over TLS + HTTP/2, channels
/// managed with `apns-relay channels` as an operator would.
@Suite("Channel intents through the relay", .stopsItsRelays, .timeLimit(.minutes(3)))
struct ChannelRelayTests {
    static let bundleID = "com.example.app"
    static let update = #"{"aps":{"event":"update","timestamp":1732000000,"content-state":{"score":"2-1"}}}"#

    static func intent(_ id: String, channel: String, topic: String = bundleID, extra: String = "", payload: String = update) -> String {
        #"{"id":"\#(id)","channel_id":"\#(channel)","topic":"\#(topic)"\#(extra),"payload":\#(payload)}"#
    }

    /// Runs `apns-relay channels <arguments>` against the harness's simulator with its key;
    /// the exit status and the JSON lines printed.
    static func channels(_ harness: RelayHarness, _ arguments: [String]) async throws -> (status: Int32, lines: [[String: Any]]) {
        guard case .token(let teamID, let keyID, let keyFile) = harness.configuration.apns.credentials[0].kind else {
            throw HarnessCredentialIsNotAToken()
        }
        let output = try await RelayBinary.run(["channels"] + arguments + [
            "--environment", harness.simulator.url, "--insecure", "--bundle-id", bundleID,
            "--team-id", teamID, "--key-id", keyID, "--key-file", keyFile,
        ])
        let lines = try output.stdout.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        return (output.status, lines)
    }

    /// Create → send on it → read → list → delete → send again (400 ChannelNotRegistered).
    /// Dedupe by (topic, id) holds for channel intents; the device rate limit does not apply.
    @Test(arguments: RedisKind.allCases)
    func aChannelsLifeThroughTheRelay(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let harness = try await RelayHarness.start(configureRelay: {
            redis.apply(to: &$0)
            $0.policy.dedupeWindowSeconds = 3600
            // One send per device per 100 s: a channel is not a device.
            $0.policy.defaults.rateLimit = .init(burst: 1, refillPerSecond: 0.01)
        })
        let created = try await Self.channels(harness, ["create", "--storage-policy", "1"])
        let channel = try #require(created.lines.first?["channel_id"] as? String, "\(created)")

        for n in 1...3 { try await harness.produce(Self.intent("live-\(n)", channel: channel), key: channel) }
        let sent = try await harness.outcomes(count: 3)
        #expect(sent.map { $0["status"] as? String } == ["delivered", "delivered", "delivered"], "\(sent)")
        let broadcasts = harness.simulator.broadcasts
        #expect(broadcasts.count == 3 && broadcasts.allSatisfy { $0.channelID == channel && $0.bundleID == Self.bundleID })
        #expect(broadcasts.allSatisfy { $0.priority == 10 && $0.expiration > Int64(Date().timeIntervalSince1970) })
        for outcome in sent {
            #expect(outcome["channel_id"] as? String == channel && outcome["token"] is NSNull, "\(outcome)")
            #expect(outcome["http_status"] as? Int == 200 && outcome["attempts"] as? Int == 1)
            let id = try #require(outcome["id"] as? String)
            #expect(outcome["apns_id"] as? String == APNsIdentifiers.format(Intent.apnsID(for: id)))
        }
        #expect(Set(sent.compactMap { $0["apns_unique_id"] as? String }) == Set(broadcasts.map(\.uniqueID)))

        // The same intent again: answered from the dedupe record, not sent.
        try await harness.produce(Self.intent("live-1", channel: channel), key: channel)
        let again = try await harness.outcomes(count: 4).filter { $0["status"] as? String == "duplicate" }
        #expect(again.count == 1 && again.first?["original_status"] as? String == "delivered" && again.first?["channel_id"] as? String == channel)
        #expect(harness.simulator.broadcasts.count == 3)

        let read = try await Self.channels(harness, ["get", "--channel-id", channel])
        #expect(read.status == 0 && read.lines.first?["message_storage_policy"] as? Int == 1, "\(read)")
        let listed = try await Self.channels(harness, ["list"])
        #expect(listed.status == 0 && listed.lines.compactMap { $0["channel_id"] as? String } == [channel], "\(listed)")
        let deleted = try await Self.channels(harness, ["delete", "--channel-id", channel])
        #expect(deleted.status == 0, "\(deleted)")

        try await harness.produce(Self.intent("live-4", channel: channel), key: channel)
        let all = try await harness.outcomes(count: 5)
        let gone = try #require(all.first { $0["id"] as? String == "live-4" })
        #expect(gone["status"] as? String == "rejected" && gone["http_status"] as? Int == 400, "\(gone)")
        #expect(gone["reason"] as? String == "ChannelNotRegistered" && gone["channel_id"] as? String == channel)

        // Keyed by the channel on Kafka.
        let messages = try await readTopic(harness.cluster.bootstrapServers, harness.outcomesTopic) { _, total in total >= 5 }
        #expect(messages.allSatisfy { $0.key.map { String(decoding: $0, as: UTF8.self) } == channel })
        // Nothing of a device's was written for the channel: no bucket, no mailbox, no last-sent record.
        let client = try redis.client()
        let keys = try await client.onEveryNode([RedisCommand("KEYS", ["*"])]).flatMap { $0.replies[0].array ?? [] }.compactMap(\.string)
        await client.shutdown()
        let seen = (1...4).map { "apns-relay:seen:{channel:\(channel)}:\(Self.bundleID):live-\($0)" }
        #expect(Set(keys.filter { !$0.hasPrefix("apns-relay:jwt:") }) == Set(seen), "\(keys)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// `policy.channels.rate_limit`: a burst of updates on a channel that stores the most recent
    /// message goes out as the channel's bucket allows. Past it the newest update waits in the
    /// channel's mailbox and the older ones are `coalesced` by it; on a No-Message-Stored channel
    /// (expiration 0, nothing can wait) the newest goes when the bucket allows, else `expired`.
    /// The device rate limit still does not apply to channels.
    @Test(arguments: RedisKind.allCases)
    func aChannelsUpdatesArePacedByItsOwnBucket(_ kind: RedisKind) async throws {
        let redis = try await TestRedis.start(kind)
        let harness = try await RelayHarness.start(configureRelay: {
            redis.apply(to: &$0)
            $0.policy.dedupeWindowSeconds = 3600
            // The device limit (the default one) is not the channel's.
            // Two at once, then one every 2 s.
            $0.policy.channels.rateLimit = .init(burst: 2, refillPerSecond: 0.5)
            $0.policy.mailboxPollMilliseconds = 50
        })
        let stored = try #require(try await Self.channels(harness, ["create", "--storage-policy", "1"]).lines.first?["channel_id"] as? String)
        let unstored = try #require(try await Self.channels(harness, ["create", "--storage-policy", "0"]).lines.first?["channel_id"] as? String)
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (1...6).map {
            (Array(stored.utf8), Array(Self.intent("kept-\($0)", channel: stored).utf8))
        } + (1...4).map {
            (Array(unstored.utf8), Array(Self.intent("now-\($0)", channel: unstored, extra: #","message_storage_policy":0"#).utf8))
        })
        let outcomes = try await harness.outcomes(count: 10)
        let status = Dictionary(uniqueKeysWithValues: outcomes.compactMap { outcome in
            (outcome["id"] as? String).map { ($0, outcome["status"] as? String ?? "") }
        })
        // The stored channel: two at once, the newest waits and goes out, the rest coalesced by it.
        #expect(status["kept-1"] == "delivered" && status["kept-2"] == "delivered", "\(status)")
        #expect(status["kept-6"] == "delivered", "\(status)")
        #expect((3...5).allSatisfy { status["kept-\($0)"] == "coalesced" }, "\(status)")
        let superseded = outcomes.filter { $0["status"] as? String == "coalesced" }.map { $0["superseded_by"] as? String }
        #expect(superseded == ["kept-6", "kept-6", "kept-6"], "\(superseded)")
        // It waited for the channel's next token (2 s).
        let waited = try #require(outcomes.first { $0["id"] as? String == "kept-6" })
        #expect((waited["latency_ms"] as? Int ?? 0) >= 1500, "\(waited)")
        // The unstored channel: two at once; the two left cannot wait (expiration 0): expired.
        #expect(status["now-1"] == "delivered" && status["now-2"] == "delivered", "\(status)")
        #expect(status["now-3"] == "expired" && status["now-4"] == "expired", "\(status)")
        let broadcasts = harness.simulator.broadcasts
        #expect(broadcasts.filter { $0.channelID == stored }.count == 3 && broadcasts.filter { $0.channelID == unstored }.count == 2)
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Every broadcast reason an intent can meet maps to its outcome: the ones the relay sees
    /// first are `invalid` under APNs' name, the ones only APNs (the simulator) knows come back
    /// as APNs answered them.
    @Test func everyChannelReasonMapsToItsOutcome() async throws {
        let other = P256.Signing.PrivateKey()
        let otherKeyFile = TestFiles.path("AuthKey_other_\(UUID().uuidString.prefix(8)).p8").path
        try other.pemRepresentation.write(toFile: otherKeyFile, atomically: true, encoding: .utf8)
        let harness = try await RelayHarness.start(configureRelay: {
            // A key the simulator does not know, for another app (and another team: its fault
            // cools down that team only).
            $0.apns.credentials.append(.init(teamID: "OTHERTEAM1", keyID: "OTHERKEY01", keyFile: otherKeyFile, topics: ["com.other.live"]))
        })
        let stored = try #require(try await Self.channels(harness, ["create", "--storage-policy", "1"]).lines.first?["channel_id"] as? String)
        let unstored = try #require(try await Self.channels(harness, ["create", "--storage-policy", "0"]).lines.first?["channel_id"] as? String)
        let unknown = Data(repeating: 7, count: 16).base64EncodedString()
        let big = #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":"\#(String(repeating: "x", count: 5_100))"}}}"#
        let cases: [(id: String, json: String, key: String, status: String, http: Int?, reason: String)] = [
            ("ok", Self.intent("ok", channel: stored), stored, "delivered", 200, ""),
            ("unstored-ok", Self.intent("unstored-ok", channel: unstored, extra: #","message_storage_policy":0"#), unstored, "delivered", 200, ""),
            ("not-registered", Self.intent("not-registered", channel: unknown), unknown, "rejected", 400, "ChannelNotRegistered"),
            // The relay was not told the channel stores nothing: APNs refuses the expiration.
            ("stored-nothing", Self.intent("stored-nothing", channel: unstored), unstored, "rejected", 400, "BadExpirationDate"),
            ("provider-token", Self.intent("provider-token", channel: stored, topic: "com.other.live"), stored, "failed", 403, "InvalidProviderToken"),
            ("no-credential", Self.intent("no-credential", channel: stored, topic: "com.nobody.live"), stored, "failed", nil, "NoCredentials"),
            ("told-nothing", Self.intent("told-nothing", channel: unstored, extra: #","message_storage_policy":0,"expiration":1900000000"#),
             unstored, "invalid", nil, "BadExpirationDate"),
            ("suffix", Self.intent("suffix", channel: stored, topic: "com.example.app.push-type.liveactivity"), stored, "invalid", nil, "TopicDisallowed"),
            ("empty-id", Self.intent("empty-id", channel: ""), "", "invalid", nil, "MissingChannelId"),
            ("bad-id", Self.intent("bad-id", channel: "not base64!"), "k", "invalid", nil, "BadChannelId"),
            ("push-type", Self.intent("push-type", channel: stored, extra: #","push_type":"alert""#), stored, "invalid", nil, "InvalidPushType"),
            ("priority", Self.intent("priority", channel: stored, extra: #","priority":7"#), stored, "invalid", nil, "BadPriority"),
            ("too-large", Self.intent("too-large", channel: stored, payload: big), stored, "invalid", nil, "PayloadTooLarge"),
            ("start", Self.intent("start", channel: stored, payload: #"{"aps":{"event":"start","timestamp":1,"content-state":{}}}"#),
             stored, "invalid", nil, "BadRequestPayload"),
            ("both", Self.intent("both", channel: stored, extra: #","token":"\#(hexToken(1))""#), stored, "invalid", nil, "TokenAndChannelId"),
        ]
        for entry in cases { try await harness.produce(entry.json, key: entry.key) }
        let outcomes = try await harness.outcomes(count: cases.count)
        for entry in cases {
            let outcome = try #require(outcomes.first { $0["id"] as? String == entry.id }, "no outcome for \(entry.id)")
            #expect(outcome["status"] as? String == entry.status, "\(entry.id): \(outcome)")
            #expect(outcome["http_status"] as? Int == entry.http, "\(entry.id): \(outcome)")
            let reason = outcome["reason"] as? String ?? ""
            #expect(entry.reason.isEmpty ? reason.isEmpty : reason.hasPrefix(entry.reason), "\(entry.id): \(outcome)")
            #expect(outcome["token"] is NSNull || entry.id == "both", "\(entry.id): \(outcome)")
        }
        #expect(harness.simulator.broadcasts.map(\.expiration).sorted().first == 0)
        try await harness.stopExpectingOneOutcomeEach()
    }
}

/// `apns-relay channels` signs with a key; the harness's first credential was a certificate.
struct HarnessCredentialIsNotAToken: Error {}
