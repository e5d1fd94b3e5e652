import Common
import APNs
import APNsSimulator
import Crypto
import Foundation
import Kafka
import NIOCore
import Relay
import Testing
import KafkaTesting
import TestSupport

/// A mock Kafka cluster, the APNs simulator and a relay pipeline, all in this process.
struct RelayHarness {
    static let teamID = "TEAM123456"
    static let keyID = "ABC123DEFG"
    let cluster: KafkaMockCluster
    let simulator: APNsSimulator
    let pipeline: RelayPipeline
    let configuration: RelayConfiguration
    let producer: KafkaProducer
    let intentsTopic: String
    let outcomesTopic: String
    let running: Task<Void, Never>
    /// The outcomes published so far, to be waited on.
    let published: AsyncWatched<PublishedOutcomes>
    let stopState = HarnessStopState()

    /// - Parameters:
    ///   - preload: intents (JSON, key) on the topic before the relay starts, so that it
    ///     consumes them in one batch.
    ///   - brokers: with more than one, the invalidations topic's partitions are led by the last
    ///     broker and every other topic's by the first, so that the invalidations' produce
    ///     requests can be held (``KafkaMockCluster/pushBrokerRequestErrors(broker:apiKey:_:)``)
    ///     without holding the outcomes.
    ///   - shards: the pipeline's shard count (nil: one per core, as deployed).
    static func start(configure: (inout SimulatorConfiguration) -> Void = { _ in },
                      configureRelay: (inout RelayConfiguration) -> Void = { _ in },
                      preload: [(json: String, key: String)] = [],
                      brokers: Int32 = 1, deliveryByCallbacks: Bool = true, shards: Int? = nil, countsShardTurns: Bool = false,
                      published: (@Sendable (Outcome) -> Void)? = nil) async throws -> RelayHarness {
        let cluster = try KafkaMockCluster(brokers: Int(brokers))
        let suffix = UUID().uuidString.prefix(8)
        let intentsTopic = "apns.intents.\(suffix)", outcomesTopic = "apns.outcomes.\(suffix)"
        try cluster.createTopic(intentsTopic, partitions: 4)
        try cluster.createTopic(outcomesTopic, partitions: 4)
        let key = P256.Signing.PrivateKey()
        let keyFile = TestFiles.path("AuthKey_\(suffix).p8").path
        try key.pemRepresentation.write(toFile: keyFile, atomically: true, encoding: .utf8)
        var simulatorConfiguration = SimulatorConfiguration()
        simulatorConfiguration.signingKeys = [.init(teamID: teamID, keyID: keyID, publicKey: key.publicKey)]
        configure(&simulatorConfiguration)
        let simulator = try await APNsSimulator.start(simulatorConfiguration)

        var configuration = RelayConfiguration()
        configuration.kafka.brokers = cluster.bootstrapServers
        configuration.kafka.groupID = "relay-\(suffix)"
        configuration.kafka.intentsTopic = intentsTopic
        configuration.kafka.outcomesTopic = outcomesTopic
        // The mock cluster's rebalance waits a second less than the session (a member's leaving
        // or eviction included): 2 s.
        configuration.kafka.properties = ["session.timeout.ms": "3000", "heartbeat.interval.ms": "500"]
        configuration.apns.endpoint = simulator.url
        configuration.apns.insecureSkipVerify = true
        configuration.apns.credentials = [.init(teamID: teamID, keyID: keyID, keyFile: keyFile, topics: ["com.example.app"])]
        configuration.retry.initialBackoffMilliseconds = 20
        configuration.retry.maxBackoffMilliseconds = 200
        configureRelay(&configuration)
        for lane in configuration.kafka.lanes where lane.topic != intentsTopic {
            try cluster.createTopic(lane.topic, partitions: 4)
        }
        if !configuration.kafka.invalidationsTopic.isEmpty {
            try cluster.createTopic(configuration.kafka.invalidationsTopic, partitions: 4)
        }
        if brokers > 1 {
            for partition in Int32(0)..<4 {
                for topic in [intentsTopic, outcomesTopic] + configuration.kafka.lanes.map(\.topic) where topic != configuration.kafka.invalidationsTopic {
                    cluster.setLeader(topic: topic, partition: partition, broker: 1)
                }
                if !configuration.kafka.invalidationsTopic.isEmpty {
                    cluster.setLeader(topic: configuration.kafka.invalidationsTopic, partition: partition, broker: brokers)
                }
            }
        }
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        // All at once, in order: the producer puts them in one record batch (the mock cluster
        // answers a fetch with one record batch per partition).
        _ = try await producer.send(topic: intentsTopic, records: preload.map { (Array($0.key.utf8), Array($0.json.utf8)) })
        let seen = AsyncWatched(PublishedOutcomes())
        let application = try RelayApplication(configuration: configuration, worker: "test-worker", published: { outcome in
            seen.update { $0.all.append(outcome) }
            published?(outcome)
        }, deliveryByCallbacks: deliveryByCallbacks, shards: shards, countsShardTurns: countsShardTurns)
        let pipeline = application.pipeline
        let running = Task { await application.run() }
        let harness = RelayHarness(cluster: cluster, simulator: simulator, pipeline: pipeline, configuration: configuration,
                                   producer: producer, intentsTopic: intentsTopic, outcomesTopic: outcomesTopic, running: running,
                                   published: seen)
        StartedHarnesses.current?.add(harness)
        return harness
    }

    /// Produces one intent to `topic` (the intents topic unless told).
    func produce(_ json: String, key: String?, topic: String? = nil) async throws {
        _ = try await producer.send(topic: topic ?? intentsTopic, key: key.map { Array($0.utf8) }, value: Array(json.utf8))
    }

    /// Reads outcomes until `count` arrived (or `timeout` passed: a minute, stretched under a
    /// sanitizer).
    func outcomes(count: Int, timeout: Duration = slowed(.seconds(60))) async throws -> [[String: Any]] {
        let messages = try await readTopic(cluster.bootstrapServers, outcomesTopic, timeout: timeout) { _, total in total >= count }
        return try messages.map { try #require(try JSONSerialization.jsonObject(with: Data($0.value)) as? [String: Any]) }
    }

    /// Stops the relay and its peers (once: a test's `.stopsItsRelays` calls it again).
    func stop() async {
        guard stopState.markStopped() else { return }
        pipeline.requestStop()
        await running.value
        await producer.close()
        await simulator.stop()
    }

    /// What the relay's group committed on the intents topic, over its four partitions.
    func committedTotal() async throws -> Int64 {
        let reader = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: configuration.kafka.groupID, topics: [])
        defer { Task { await reader.close() } }
        let committed = try await reader.committed((0..<4).map { TopicPartition(topic: intentsTopic, partition: $0) })
        return committed.values.reduce(0) { $0 + max($1, 0) }
    }

    /// Stops a relay whose shutdown deadline is 1 s while one intent's work goes on, and checks
    /// that the work was abandoned at the deadline: the run ended after it, far below the work's
    /// own minute (a generous bound, a third of it: the suite runs many tests at once, and a
    /// clean clone's run on a slow sitting once took 10.8 s), with no outcome, nothing left in
    /// flight (waiting to be sent again) and nothing committed, so the intent is consumed again.
    func stopAbandoningAtTheDeadline(byCallbacks: Bool, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let stopped = ContinuousClock.now
        pipeline.requestStop()
        await running.value
        let took = ContinuousClock.now - stopped
        #expect(took >= .seconds(1), sourceLocation: sourceLocation)
        #expect(took < slowed(.seconds(20)), sourceLocation: sourceLocation)
        #expect(pipeline.outcomeCounts.isEmpty, sourceLocation: sourceLocation)
        #expect(pipeline.inFlight == 0, "abandoned, not waiting to be sent again", sourceLocation: sourceLocation)
        #expect(pipeline.intentsDrivenByCallbacks == (byCallbacks ? 1 : 0), sourceLocation: sourceLocation)
        #expect(try await committedTotal() == 0, sourceLocation: sourceLocation)
    }

    /// Stops the relay; then how many outcomes it published in all, each counted once its
    /// delivery report succeeded. Nothing else publishes outcomes: one per intent, no more.
    func stopCountingOutcomes() async -> Int {
        await stop()
        return pipeline.outcomeCounts.values.reduce(0, +)
    }
}

/// Not enough outcomes within a read's deadline; says what the read got.
struct OutcomesTimedOut: Error, CustomStringConvertible {
    var description: String
}

/// Reads `topic` from its start (partitions assigned by hand: no group join) until `enough`
/// (called with each new batch and the number read so far) says so; throws ``OutcomesTimedOut``
/// after `timeout`.
func readTopic(_ bootstrapServers: String, _ topic: String, timeout: Duration = .seconds(60),
               until enough: @escaping @Sendable (_ batch: [KafkaMessage], _ total: Int) -> Bool) async throws -> [KafkaMessage] {
    let reader = try KafkaTopicReader(bootstrapServers: bootstrapServers, topic: topic)
    do {
        let messages = try await reader.read(timeout: timeout, until: enough)
        await reader.close()
        return messages
    } catch {
        await reader.close()
        throw error.code == KafkaError.timedOutCode ? OutcomesTimedOut(description: error.message) : error
    }
}

func hexToken(_ n: Int) -> String {
    let hex = String(n, radix: 16)
    return String(repeating: "0", count: 64 - hex.count) + hex
}

func intent(_ id: String, token: String, extra: String = "", payload: String = #"{"aps":{"alert":"hi"}}"#) -> String {
    #"{"id":"\#(id)","token":"\#(token)","topic":"com.example.app","payload":\#(payload)\#(extra)}"#
}

@Suite("Relay end to end: mock Kafka, the simulator, the pipeline", .stopsItsRelays, .timeLimit(.minutes(3)))
struct RelayEndToEndTests {
    @Test func everyIntentGetsItsOutcome() async throws {
        let gone = hexToken(0xdead)
        let harness = try await RelayHarness.start { $0.behaviour.unregistered = [gone: 1_432_819_882_000] }
        let past = Int64(Date().timeIntervalSince1970) - 60
        try await harness.produce(intent("ok-1", token: hexToken(1), extra: #","collapse_id":"chat-42","priority":5"#), key: hexToken(1))
        try await harness.produce(intent("gone-1", token: gone), key: gone)
        try await harness.produce(intent("late-1", token: hexToken(2), extra: #","expiration":\#(past)"#), key: hexToken(2))
        try await harness.produce(#"{"id":"nocred-1","token":"\#(hexToken(3))","topic":"com.other.app","payload":{"aps":{}}}"#, key: hexToken(3))
        try await harness.produce("this is not json", key: "k")
        try await harness.produce(#"{"token":"\#(hexToken(4))","topic":"com.example.app","payload":{"aps":{}}}"#, key: hexToken(4))
        try await harness.produce(intent("badtoken-1", token: "xyz"), key: "xyz")
        try await harness.produce(intent("big-1", token: hexToken(5), payload: #"{"aps":{"alert":"\#(String(repeating: "x", count: 5000))"}}"#), key: hexToken(5))
        try await harness.produce(#"{"id":"nopayload-1","token":"\#(hexToken(6))","topic":"com.example.app"}"#, key: hexToken(6))

        let outcomes = try await harness.outcomes(count: 9)
        #expect(outcomes.count == 9)
        func outcome(_ id: String) -> [String: Any]? { outcomes.first { $0["id"] as? String == id } }

        let ok = try #require(outcome("ok-1"))
        #expect(ok["v"] as? Int == 1)
        #expect(ok["status"] as? String == "delivered")
        #expect(ok["http_status"] as? Int == 200)
        #expect(ok["reason"] is NSNull)
        #expect(ok["token"] as? String == hexToken(1))
        #expect(ok["topic"] as? String == "com.example.app")
        #expect(ok["attempts"] as? Int == 1)
        #expect(ok["worker"] as? String == "test-worker")
        #expect(ok["unregistered_at"] is NSNull)
        #expect((ok["apns_id"] as? String)?.count == 36)
        #expect(ok["partition"] is Int && ok["offset"] is Int && ok["at"] is Int && ok["latency_ms"] is Int)
        let sent = try #require(harness.simulator.accepted.first { $0.deviceToken == hexToken(1) })
        #expect(sent.collapseID == "chat-42")
        #expect(sent.priority == 5)
        #expect(sent.apnsID.lowercased() == (ok["apns_id"] as? String))

        let gone1 = try #require(outcome("gone-1"))
        #expect(gone1["status"] as? String == "unregistered")
        #expect(gone1["http_status"] as? Int == 410)
        #expect(gone1["reason"] as? String == "Unregistered")
        #expect(gone1["unregistered_at"] as? Int64 == 1_432_819_882_000)

        #expect(outcome("late-1")?["status"] as? String == "expired")
        #expect(outcome("late-1")?["attempts"] as? Int == 0)
        #expect(outcome("nocred-1")?["status"] as? String == "failed")
        #expect(outcome("nocred-1")?["reason"] as? String == "NoCredentials")

        let invalid = outcomes.filter { $0["status"] as? String == "invalid" }
        #expect(invalid.count == 5)
        let reasons = invalid.compactMap { $0["reason"] as? String }
        #expect(reasons.contains { $0.hasPrefix("NotJSON") })
        #expect(reasons.contains { $0.hasPrefix("MissingField") && $0.contains("\"id\"") })
        #expect(reasons.contains { $0.hasPrefix("MissingField") && $0.contains("\"payload\"") })
        #expect(outcome("badtoken-1")?["reason"] as? String == "BadDeviceToken: device token must be 64 to 200 hex characters of even length, got 3")
        #expect((outcome("big-1")?["reason"] as? String)?.hasPrefix("PayloadTooLarge") == true)
        #expect(harness.simulator.accepted.count == 1)
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func retriesAfter503sThenDelivers() async throws {
        let harness = try await RelayHarness.start { $0.behaviour.failNext = (2, 503) }
        try await harness.produce(intent("retry-1", token: hexToken(9)), key: hexToken(9))
        let outcomes = try await harness.outcomes(count: 1)
        #expect(outcomes.first?["status"] as? String == "delivered")
        #expect(outcomes.first?["attempts"] as? Int == 3)
        #expect(harness.simulator.answers["503 ServiceUnavailable"] == 2)
        // Driven by callbacks, its backoffs were timers: no turn of it went on in a task.
        #expect(harness.pipeline.intentsDrivenByCallbacks == 1)
        #expect(harness.pipeline.callbackTurnsInTasks == 0)
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// An intent waiting out a minute's backoff after a 503 is abandoned at the shutdown
    /// deadline (1 s), not waited for: no outcome, no commit, nothing left waiting. Driven by
    /// callbacks, its backoff is a timer (``BackoffTimers``) the deadline ends; as a task, its
    /// sleep is cancelled.
    @Test(arguments: [false, true])
    func aRetryWaitingOutItsBackoffIsAbandonedAtTheShutdownDeadline(byCallbacks: Bool) async throws {
        let harness = try await RelayHarness.start(configure: { $0.behaviour.failNext = (1, 503) }, configureRelay: { relay in
            relay.shutdownDeadlineSeconds = 1
            relay.retry.initialBackoffMilliseconds = 60_000
            relay.retry.maxBackoffMilliseconds = 60_000
        }, deliveryByCallbacks: byCallbacks)
        try await harness.produce(intent("backoff-1", token: hexToken(2)), key: hexToken(2))
        // In its backoff (a timer, or a task's sleep) when the relay stops.
        try await waitUntil { harness.pipeline.retriesWaitingOutBackoff == 1 }
        try await harness.stopAbandoningAtTheDeadline(byCallbacks: byCallbacks)
        #expect(harness.pipeline.retriesWaitingOutBackoff == 0)
        #expect(harness.simulator.answers == ["503 ServiceUnavailable": 1])
        await harness.stop()
    }

    @Test func oneDeviceKeepsItsOrder() async throws {
        let harness = try await RelayHarness.start { $0.behaviour.latency = .milliseconds(2) }
        let device = hexToken(77)
        for index in 0..<50 {
            try await harness.produce(intent("order-\(index)", token: device, payload: #"{"aps":{"alert":"\#(index)"}}"#), key: device)
            // Other devices interleave.
            try await harness.produce(intent("other-\(index)", token: hexToken(1000 + index)), key: hexToken(1000 + index))
        }
        let outcomes = try await harness.outcomes(count: 100)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" })
        let sequence = harness.simulator.accepted.filter { $0.deviceToken == device }
            .map { String(decoding: $0.payload, as: UTF8.self) }
        #expect(sequence == (0..<50).map { #"{"aps":{"alert":"\#($0)"}}"# })
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func committedOffsetsFollowOutcomes() async throws {
        let harness = try await RelayHarness.start()
        for index in 0..<40 { try await harness.produce(intent("c-\(index)", token: hexToken(index)), key: hexToken(index)) }
        _ = try await harness.outcomes(count: 40)
        try await harness.stopExpectingOneOutcomeEach()  // commits on the way out
        let reader = try KafkaConsumer(bootstrapServers: harness.cluster.bootstrapServers,
                                       groupID: harness.pipeline.configuration.kafka.groupID, topics: [])
        let committed = try await reader.committed((0..<4).map { TopicPartition(topic: harness.intentsTopic, partition: $0) })
        #expect(committed.values.reduce(0) { $0 + max($1, 0) } == 40)
        await reader.close()
    }

    /// Review 3.2: work still running at the shutdown deadline is cancelled, not waited for:
    /// a request APNs never answers (request timeout 60 s) ends the relay about 1 s after the
    /// stop, without an outcome and without a commit, so the intent is consumed again. Driven by
    /// callbacks (no task for the deadline to cancel), the intent is abandoned when its client
    /// closes and cuts the request: nothing of it is left once the relay stopped (no retry).
    @Test(arguments: [false, true])
    func workLeftAtTheShutdownDeadlineIsCancelled(byCallbacks: Bool) async throws {
        let harness = try await RelayHarness.start(configure: { $0.behaviour.blackHole = true }, configureRelay: { relay in
            relay.shutdownDeadlineSeconds = 1
            relay.apns.requestTimeoutSeconds = 60
        }, deliveryByCallbacks: byCallbacks)
        try await harness.produce(intent("stuck-1", token: hexToken(1)), key: hexToken(1))
        try #require(await harness.simulator.waitForAnswers(atLeast: 1, within: .seconds(20)))
        try await harness.stopAbandoningAtTheDeadline(byCallbacks: byCallbacks)
        await harness.stop()
    }

    /// Review 3.3: intents waiting behind their device take no send slot. With 100 slots, a
    /// device with 2,000 intents queued (each answered after 50 ms, or never accepted) does not
    /// hold up another device's intents consumed after them.
    @Test(arguments: [false, true])
    func aDeviceWithABacklogDoesNotStallTheOthers(tooManyRequests: Bool) async throws {
        let hot = hexToken(0xa), other = hexToken(0xb)
        let firstOutcome = Locked<[String: ContinuousClock.Instant]>([:])
        let harness = try await RelayHarness.start(configure: { simulator in
            simulator.behaviour.latency = .milliseconds(50)
            if tooManyRequests {
                // Every device's first 10 go through; the hot device's others get 429 for an hour.
                simulator.behaviour.rateLimitPerDevice = 10
                simulator.behaviour.rateLimitWindow = .hours(1)
            }
        }, configureRelay: { relay in
            relay.limits.maxInFlight = 100
            // All 5,000 wait (the per-recipient cap has a test of its own).
            relay.limits.maxWaitingPerRecipient = 10_000
            relay.shutdownDeadlineSeconds = 1
        }, published: { outcome in
            guard let id = outcome.id else { return }
            firstOutcome.withLock { $0[id] = $0[id] ?? .now }
        })
        // The relay joined its group and consumes (the mock cluster's join takes seconds).
        try await harness.produce(intent("warm-up", token: hexToken(0xc)), key: hexToken(0xc))
        try await waitUntil { firstOutcome.withLock { $0["warm-up"] != nil } }
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<5000).map {
            (Array(hot.utf8), Array(intent("hot-\($0)", token: hot).utf8))
        })
        let produced = ContinuousClock.now
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<10).map {
            (Array(other.utf8), Array(intent("other-\($0)", token: other).utf8))
        })
        try await waitUntil(timeout: .seconds(30)) {
            firstOutcome.withLock { seen in (0..<10).allSatisfy { seen["other-\($0)"] != nil } }
        }
        let (last, hotBefore) = firstOutcome.withLock { seen in
            let last = (0..<10).compactMap { seen["other-\($0)"] }.max()!
            return (last, seen.filter { $0.key.hasPrefix("hot-") && $0.value <= last }.count)
        }
        // The other device did not wait for the backlog: the hot one (one notification per
        // 50 ms at best) had answered only a few of its 5,000 by then. (About 1 s after they were
        // produced on a quiet machine; the bound below leaves room for a loaded one.)
        #expect(hotBefore < 200)
        #expect(last - produced < slowed(.seconds(10)))
        await harness.stop()
    }

    /// Every device's first notification goes through; the others get 429 for an hour.
    static func oneNotificationPerDevice(_ simulator: inout SimulatorConfiguration) {
        simulator.behaviour.rateLimitPerDevice = 1
        simulator.behaviour.rateLimitWindow = .hours(1)
    }

    /// Each intent's first outcome: its status, reason and when it was published.
    final class FirstOutcomes: Sendable {
        typealias Seen = [String: (status: String, reason: String?, at: ContinuousClock.Instant)]
        private let seen = Locked<Seen>([:])

        func withLock<T>(_ body: (inout Seen) -> T) -> T { seen.withLock { body(&$0) } }
    }

    /// A relay (no Redis) in front of APNs answering every device's first notification and 429
    /// after it (``oneNotificationPerDevice(_:)``), keeping each intent's first outcome; it
    /// answered a warm-up intent.
    static func throttledRelay(_ configureRelay: @escaping (inout RelayConfiguration) -> Void) async throws -> (RelayHarness, FirstOutcomes) {
        let answered = FirstOutcomes()
        let harness = try await RelayHarness.start(configure: Self.oneNotificationPerDevice, configureRelay: { relay in
            relay.shutdownDeadlineSeconds = 1
            configureRelay(&relay)
        }, published: { outcome in
            guard let id = outcome.id else { return }
            answered.withLock { $0[id] = $0[id] ?? (outcome.status.rawValue, outcome.reason, .now) }
        })
        try await harness.produce(intent("warm-up", token: hexToken(0xe)), key: hexToken(0xe))
        try await waitUntil { answered.withLock { $0["warm-up"] != nil } }
        return (harness, answered)
    }

    /// One recipient that cannot drain (APNs answers its every notification but the first 429,
    /// no Redis to park in) keeps at most `limits.max_waiting_per_recipient` intents waiting:
    /// the rest come out `failed` (`RecipientBacklog`) at once, and the global waiting room
    /// (`limits.max_waiting`) stays open to other devices.
    @Test func aRecipientThatCannotDrainKeepsOnlyItsShareOfTheWaitingRoom() async throws {
        let hot = hexToken(0xf)
        let (harness, answered) = try await Self.throttledRelay { relay in
            relay.limits.maxInFlight = 100
            relay.limits.maxWaiting = 100
            relay.limits.maxWaitingPerRecipient = 20
        }
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<150).map {
            (Array(hot.utf8), Array(intent("hot-\($0)", token: hot).utf8))
        })
        let produced = ContinuousClock.now
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<10).map {
            (Array(hexToken(0x100 + $0).utf8), Array(intent("other-\($0)", token: hexToken(0x100 + $0)).utf8))
        })
        // The other devices' outcomes and the hot device's `RecipientBacklog` ones are published
        // side by side: wait for both (the latter at once, not after retries; under a loaded
        // suite some of them came after the others').
        func backlog(_ seen: FirstOutcomes.Seen) -> Int {
            seen.filter { $0.key.hasPrefix("hot-") && $0.value.reason == "RecipientBacklog" }.count
        }
        try await waitUntil(timeout: .seconds(30)) {
            answered.withLock { seen in (0..<10).allSatisfy { seen["other-\($0)"] != nil } && backlog(seen) >= 120 }
        }
        let (others, backlogged, lastBacklogged) = answered.withLock { seen in
            ((0..<10).map { seen["other-\($0)"]! }, backlog(seen),
             seen.filter { $0.key.hasPrefix("hot-") && $0.value.reason == "RecipientBacklog" }.map(\.value.at).max()!)
        }
        #expect(others.allSatisfy { $0.status == "delivered" })
        let last = others.map(\.at).max()!
        #expect(last - produced < slowed(.seconds(10)), "the other devices waited \(last - produced)")
        #expect(lastBacklogged - produced < slowed(.seconds(10)), "the backlog's answers took \(lastBacklogged - produced)")
        // The hot device's first went out, its next 20 wait (retried until the deadline); the
        // other 129 were answered at once (a few fewer if the first was answered while the rest
        // were being admitted).
        #expect((120...129).contains(backlogged), "\(backlogged) answered RecipientBacklog")
        await harness.stop()
    }

    /// `retry.deadline_seconds` runs from consuming: intents that waited behind their device's
    /// earlier ones (each retried until the deadline, no Redis to park in) give up together,
    /// not one deadline after another.
    @Test func theRetryDeadlineRunsFromConsuming() async throws {
        let device = hexToken(0xd)
        let (harness, answered) = try await Self.throttledRelay { relay in
            relay.retry.deadlineSeconds = 2
            relay.retry.initialBackoffMilliseconds = 100
            relay.retry.maxBackoffMilliseconds = 400
        }
        let count = 6
        let produced = ContinuousClock.now
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            (Array(device.utf8), Array(intent("queued-\($0)", token: device).utf8))
        })
        try await waitUntil(timeout: .seconds(60)) { answered.withLock { seen in (0..<count).allSatisfy { seen["queued-\($0)"] != nil } } }
        let outcomes = answered.withLock { seen in (0..<count).map { seen["queued-\($0)"]! } }
        #expect(outcomes.filter { $0.status == "delivered" }.count == 1)
        #expect(outcomes.filter { $0.status == "failed" }.count == count - 1)
        // Every one answered within the deadline of its consumption (plus backoff and a loaded
        // machine's slack: a clean clone's run took 7.6 s from the produce); one deadline after
        // another, the last would take 10 s after the first was consumed.
        let latest = outcomes.map(\.at).max()!
        #expect(latest - produced < slowed(.milliseconds(8_500)), "answered after \(outcomes.map { $0.at - produced })")
        await harness.stop()
    }

    /// Review 3.4: an intent retried for a long time keeps every later offset of its partition
    /// uncommitted, and the relay remembers them all. Past `limits.max_uncommitted_per_partition`
    /// that partition pauses (the others go on); it resumes once the stuck intent ended.
    @Test func aStuckIntentPausesItsPartitionPastTheUncommittedLimit() async throws {
        let stuck = hexToken(0x5)
        let harness = try await RelayHarness.start(configure: Self.oneNotificationPerDevice, configureRelay: { relay in
            relay.limits.maxUncommittedPerPartition = 1000
            relay.retry.deadlineSeconds = 4
        })
        try await harness.produce(intent("stuck-0", token: stuck), key: stuck)
        try await harness.produce(intent("stuck-1", token: stuck), key: stuck)
        // Other devices' intents, keyed like the stuck one so that they share its partition:
        // they are delivered, and wait behind it to be committed.
        let others = 1500
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<others).map {
            (Array(stuck.utf8), Array(intent("other-\($0)", token: hexToken(0x1000 + $0)).utf8))
        })
        try await waitUntil { !harness.pipeline.heldPartitions.isEmpty }
        #expect(harness.pipeline.heldPartitions.count == 1)
        let outcomes = try await harness.outcomes(count: others + 2)
        #expect(Set(outcomes.compactMap { $0["id"] as? String }).count == others + 2)
        #expect(outcomes.first { $0["id"] as? String == "stuck-1" }?["status"] as? String != "delivered")
        try await waitUntil { harness.pipeline.heldPartitions.isEmpty }
        try await harness.stopExpectingOneOutcomeEach()
    }

    /// Review 2.1: a relay that loses partitions in a rebalance under load starts none of their
    /// work from the moment librdkafka revokes them, and the work it has at APNs ends (its
    /// offsets committed) before the revocation is acknowledged: no intent reaches APNs from
    /// both relays (no Redis, so nothing else would catch it).
    @Test func aRebalanceUnderLoadSendsNoIntentFromBothRelays() async throws {
        // A minute per request: no answer is lost on a loaded machine (a request timed out that
        // APNs took is sent again, by its relay or, its partition moved meanwhile, by the other:
        // the second send docs/outcomes.md allows, not the one this test is about).
        // The first relay's revocation waits for its work at APNs on three shards; the second
        // has one.
        let harness = try await RelayHarness.start(configure: { $0.behaviour.latency = .milliseconds(200) },
                                                   configureRelay: { $0.limits.maxInFlight = 25; $0.apns.requestTimeoutSeconds = 60 },
                                                   shards: 3)
        let count = 1500
        _ = try await harness.producer.send(topic: harness.intentsTopic, records: (0..<count).map {
            let token = hexToken(0x2000 + $0 % 150)
            return (Array(token.utf8), Array(intent("r-\($0)", token: token).utf8))
        })
        // The first relay is saturated, then a second joins the group.
        try await waitUntil { harness.pipeline.inFlight >= 25 }
        let second = try RelayApplication(configuration: harness.configuration, worker: "second", shards: 1)
        let running = Task { await second.run() }
        // Every intent reached APNs (once, or twice when a commit was refused: see below).
        try await waitUntil(timeout: .seconds(90)) {
            Set(harness.simulator.accepted.map(\.apnsID)).count >= count
        }
        #expect(second.pipeline.outcomeCounts.values.reduce(0, +) > 0, "the second relay took partitions over")
        let accepted = harness.simulator.accepted.map(\.apnsID)
        let outcomes = "outcomes: \(harness.pipeline.outcomeCounts) from the first relay, \(second.pipeline.outcomeCounts) from the second; "
            + "revocation commits refused: \(harness.pipeline.revocationCommitFailures) and \(second.pipeline.revocationCommitFailures)"
        // librdkafka's mock coordinator refuses a commit while the group is joining or syncing
        // (real Kafka accepts it while preparing a rebalance): when it refused the revocation's
        // commit (counted), the next owner starts from an earlier commit and sends again what
        // was finished since. Only then are duplicates a known issue of the test cluster.
        let refused = harness.pipeline.revocationCommitFailures + second.pipeline.revocationCommitFailures
        #expect(Set(accepted).count == count, "\(outcomes)")
        withKnownIssue("the mock coordinator refused the revocation's commit", isIntermittent: true) {
            #expect(accepted.count == count, "\(accepted.count - Set(accepted).count) intents reached APNs twice; \(outcomes)")
        } when: {
            refused > 0
        }
        second.requestStop()
        await running.value
        await harness.stop()
    }
}
