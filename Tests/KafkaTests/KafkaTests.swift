import Common
import Foundation
import Kafka
import TestSupport
import Testing
import KafkaTesting

/// Waits for `condition` over the consumer's events, up to `timeout`.
func collect(_ consumer: KafkaConsumer, timeout: Duration = .seconds(30),
             until done: @escaping @Sendable ([KafkaMessage], [KafkaConsumerEvent]) -> Bool) async throws -> (messages: [KafkaMessage], events: [KafkaConsumerEvent]) {
    try await withThrowingTaskGroup(of: ([KafkaMessage], [KafkaConsumerEvent])?.self) { group in
        group.addTask {
            var messages: [KafkaMessage] = []
            var events: [KafkaConsumerEvent] = []
            for await event in consumer.events {
                if ProcessInfo.processInfo.environment["KAFKA_TEST_TRACE"] != nil { print(Date(), event) }
                events.append(event)
                if case .messages(let batch) = event { messages += batch }
                if done(messages, events) { return (messages, events) }
            }
            return (messages, events)
        }
        group.addTask {
            try await Task.sleep(for: timeout)
            return nil
        }
        let first = try await group.next()!
        group.cancelAll()
        guard let result = first else { throw TimedOut() }
        return result
    }
}

struct TimedOut: Error {}

/// The mock cluster rebalances only when a member's session times out; keep that short.
let fastGroup = ["session.timeout.ms": "3000", "heartbeat.interval.ms": "500"]

func uniqueName(_ prefix: String) -> String { "\(prefix)-\(UUID().uuidString.prefix(8))" }

/// A one-broker mock cluster with an `outcomes-…` topic of `partitions`, and a producer that
/// knows the topic. The caller keeps the cluster alive to its end (`withExtendedLifetime`).
func preparedProducer(partitions: Int) async throws -> (KafkaMockCluster, String, KafkaProducer) {
    let cluster = try KafkaMockCluster(brokers: 1)
    let topic = uniqueName("outcomes")
    try cluster.createTopic(topic, partitions: partitions)
    let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
    try await producer.prepare(topics: [topic])
    return (cluster, topic, producer)
}

/// Each test has a mock cluster of its own; they run beside each other. The rebalance tests
/// are in ``KafkaRebalanceTests``.
@Suite("Kafka over librdkafka's mock cluster", .timeLimit(.minutes(3)))
struct KafkaTests {
    @Test func producesAndConsumesInKeyOrder() async throws {
        let cluster = try KafkaMockCluster(brokers: 3)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 4)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        var deliveries: [KafkaProducer.Delivery] = []
        for index in 0..<200 {
            let key = Array("device-\(index % 20)".utf8)
            deliveries.append(try await producer.send(topic: topic, key: key, value: Array("\(index)".utf8)))
        }
        #expect(Set(deliveries.map { "\($0.partition):\($0.offset)" }).count == 200)
        await producer.close()

        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic], properties: fastGroup)
        let (messages, events) = try await collect(consumer) { messages, _ in messages.count >= 200 }
        #expect(messages.count == 200)
        #expect(events.contains { if case .assigned(let partitions) = $0 { return partitions.count == 4 }; return false })
        // Per key (one device), values come back in the order they were produced.
        var byKey: [String: [Int]] = [:]
        for message in messages {
            byKey[String(decoding: message.key ?? [], as: UTF8.self), default: []].append(Int(String(decoding: message.value, as: UTF8.self))!)
        }
        #expect(byKey.count == 20)
        for values in byKey.values { #expect(values == values.sorted()) }
        #expect(messages.allSatisfy { $0.topic == topic && $0.timestamp != nil })
        // Everything consumed: no lag on any of the four partitions.
        try await waitUntil { consumer.lag.count == 4 }
        #expect(consumer.lag.values.allSatisfy { $0 == 0 })
        await consumer.close()
    }

    /// A subscription librdkafka refuses is reported (the initialiser no longer subscribes, so
    /// it cannot throw it): as the consumer's failure and as an error event.
    @Test func aRefusedSubscriptionIsReported() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [""],
                                         properties: fastGroup)
        #expect(consumer.failure == nil)
        var iterator = consumer.events.makeAsyncIterator()
        let first = await iterator.next()
        guard case .error(let error) = first else {
            Issue.record("expected an error event, got \(String(describing: first))")
            return
        }
        #expect(consumer.failure == error)
        await consumer.close()
    }

    @Test func storedOffsetsAreCommittedAndResumedFrom() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        let group = uniqueName("group")
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for index in 0..<100 { _ = try await producer.send(topic: topic, key: Array("k\(index % 7)".utf8), value: Array("first-\(index)".utf8)) }

        let first = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: fastGroup)
        let (firstMessages, _) = try await collect(first) { messages, _ in messages.count >= 100 }
        // Only the first 60 count as processed.
        for message in firstMessages.prefix(60) { try first.storeOffset(message.topicPartition, offset: message.offset) }
        let processed = Set(firstMessages.prefix(60).map { "\($0.partition):\($0.offset)" })
        // Within a partition, everything before a stored offset counts as processed too.
        var highest: [Int32: Int64] = [:]
        for message in firstMessages.prefix(60) { highest[message.partition] = max(highest[message.partition] ?? -1, message.offset) }
        try await first.commit()
        let committed = try await first.committed([TopicPartition(topic: topic, partition: 0), TopicPartition(topic: topic, partition: 1)])
        for (partition, offset) in highest { #expect(committed[TopicPartition(topic: topic, partition: partition)] == offset + 1) }
        // A deadline under a second is kept as it is (not cut to 0 ms).
        let again = try await first.committed([TopicPartition(topic: topic, partition: 0), TopicPartition(topic: topic, partition: 1)],
                                              timeout: .milliseconds(900))
        #expect(again == committed)
        await first.close()

        // A partition's messages arrive in order, so the 60 processed are each partition's first
        // ones: 40 are left.
        let expected = firstMessages.filter { $0.offset > (highest[$0.partition] ?? -1) }
        #expect(expected.count == 40)
        let second = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: fastGroup)
        let (secondMessages, _) = try await collect(second) { messages, _ in messages.count >= expected.count }
        // Exactly the unprocessed ones, once each: none of the processed comes again.
        #expect(secondMessages.count == 40)
        #expect(secondMessages.allSatisfy { !processed.contains("\($0.partition):\($0.offset)") })
        #expect(Set(secondMessages.map { "\($0.partition):\($0.offset)" }) == Set(expected.map { "\($0.partition):\($0.offset)" }))
        await second.close()
        await producer.close()
    }

    /// An outage (every produce refused), then on every broker three refusals and a produce
    /// the broker appends but answers after the producer's 1 s socket timeout, so the producer
    /// sends it again: every record is delivered, every injected answer was used, and the log,
    /// read to its high watermarks, holds every record.
    @Test func deliveriesSurviveAnOutageAndInjectedErrors() async throws {
        let cluster = try KafkaMockCluster(brokers: 3)
        let topic = uniqueName("outcomes")
        try cluster.createTopic(topic, partitions: 3)
        // Each broker leads one partition: each gets produce requests, and so its injections.
        for partition in Int32(0)..<3 { cluster.setLeader(topic: topic, partition: partition, broker: partition + 1) }
        let partitions = (0..<3).map { TopicPartition(topic: topic, partition: $0) }
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers,
                                         properties: ["retry.backoff.ms": "50", "socket.timeout.ms": "1000"])
        _ = try await producer.send(topic: topic, key: nil, value: Array("warm-up".utf8))
        let reader = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [],
                                       properties: fastGroup)
        cluster.failRequests(apiKey: KafkaMockCluster.APIKey.produce, errorCode: KafkaErrorCode.notLeaderForPartition)
        let sends = Task {
            try await withThrowingTaskGroup(of: KafkaProducer.Delivery.self) { group in
                for index in 0..<300 {
                    group.addTask { try await producer.send(topic: topic, key: Array("k\(index % 10)".utf8), value: Array("v\(index)".utf8)) }
                }
                var all: [KafkaProducer.Delivery] = []
                for try await delivery in group { all.append(delivery) }
                return all
            }
        }
        // Every record is handed over, and none reached a log while the brokers refuse them.
        try await waitUntil { producer.outstanding == 300 }
        #expect(try await reader.highWatermarks(partitions).values.reduce(0, +) == 1)
        let injected: [(code: Int32, delayMilliseconds: Int32)] = [
            (KafkaErrorCode.notLeaderForPartition, 0), (KafkaErrorCode.requestTimedOut, 0), (KafkaErrorCode.notEnoughReplicas, 0),
            (0, 2000),
        ]
        for broker in Int32(1)...3 { cluster.pushBrokerRequestErrors(broker: broker, apiKey: KafkaMockCluster.APIKey.produce, injected) }
        cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.produce)
        let deliveries = try await sends.value
        #expect(deliveries.count == 300)
        for broker in Int32(1)...3 {
            #expect(cluster.brokerErrorsLeft(broker: broker, apiKey: KafkaMockCluster.APIKey.produce) == 0, "broker \(broker)")
        }

        // Idempotence would keep each record once, the late-answered batches included. The mock
        // broker of librdkafka 2.0.2 (Debian's) does not check producer sequence numbers: it
        // appends a resent batch again, so the log holds those records twice — a property of the
        // test broker, pinned here so that a librdkafka whose mock checks them shows up. Every
        // record is there at least once either way.
        let highs = try await reader.highWatermarks(partitions)
        withKnownIssue("librdkafka 2.0.2's mock broker appends a resent idempotent batch again") {
            #expect(highs.values.reduce(0, +) == 301, "\(highs)")
        }
        await reader.close()
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic], properties: fastGroup)
        let total = Int(highs.values.reduce(0, +))
        let (messages, _) = try await collect(consumer) { messages, _ in messages.count >= total }
        #expect(messages.count == total)
        #expect(Set(messages.map { String(decoding: $0.value, as: UTF8.self) }) == Set(["warm-up"] + (0..<300).map { "v\($0)" }))
        await consumer.close()
        await producer.close()
    }

    /// A producer that prepared its topics knows their partitions' leaders before its first
    /// record: a record for another broker does not wait on a metadata request that went out
    /// behind a produce a slow broker holds (the mock answers a connection's requests in
    /// order). Here the producer knows only broker 3, which holds the first record's produce
    /// request for 12 s; the second record's topic is led by broker 1. (Without the preparation
    /// the second record waited the whole 12 s.)
    @Test func aProducersTopicsAreKnownBeforeItsFirstRecord() async throws {
        let cluster = try KafkaMockCluster(brokers: 3)
        let held = uniqueName("invalidations"), other = uniqueName("outcomes")
        try cluster.createTopic(held, partitions: 1)
        try cluster.createTopic(other, partitions: 1)
        cluster.setLeader(topic: held, partition: 0, broker: 3)
        cluster.setLeader(topic: other, partition: 0, broker: 1)
        let brokerThree = String(try #require(cluster.bootstrapServers.split(separator: ",").last))
        let producer = try KafkaProducer(bootstrapServers: brokerThree, properties: ["socket.timeout.ms": "60000"])
        #expect(try await producer.prepare(topics: [held, other]) == [held: 1, other: 1])
        // A topic that cannot be (librdkafka refuses names over 512 bytes) is an error.
        let impossible = String(repeating: "t", count: 600)
        await #expect(throws: KafkaError.self) { try await producer.prepare(topics: [impossible], timeout: .milliseconds(500)) }
        cluster.pushBrokerRequestErrors(broker: 3, apiKey: KafkaMockCluster.APIKey.produce, [(0, 12_000)])
        let start = ContinuousClock.now
        let first = Task { try await producer.send(topic: held, key: nil, value: [1]) }
        try await waitUntil { cluster.brokerErrorsLeft(broker: 3, apiKey: KafkaMockCluster.APIKey.produce) == 0 }
        _ = try await producer.send(topic: other, key: nil, value: [2])
        let elapsed = ContinuousClock.now - start
        #expect(elapsed < .seconds(8), "the second record waited for the first one's broker: \(elapsed)")
        _ = try await first.value
        #expect(ContinuousClock.now - start >= .seconds(12), "the first record was held")
        await producer.close()
    }

    @Test func sendingAfterCloseFailsAtOnce() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("outcomes")
        try cluster.createTopic(topic, partitions: 1)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        _ = try await producer.send(topic: topic, key: nil, value: [1])
        await producer.close()
        await #expect(throws: KafkaError.self) { _ = try await producer.send(topic: topic, key: nil, value: [2]) }
    }

    /// The handler is reached the same way after hundreds of polls as after the first: each
    /// poll reads it, and when the lock lent it as `inout` every read left it wrapped two
    /// thunks deeper (``LockedFunction``), until its calls took hundreds of frames.
    @Test func theReportHandlerIsReachedAsDirectlyAfterManyPolls() async throws {
        let (cluster, topic, producer) = try await preparedProducer(partitions: 1)
        let depths = Locked<[Int: Int]>([:])
        let reported = AsyncWatched(0)
        let batcher = producer.reportBatcher { batch in
            let depth = Thread.callStackSymbols.count
            depths.withLock { for report in batch { $0[report.slot] = depth } }
            reported.update { $0 += batch.count }
        }
        // One record at a time: each report takes polls of its own.
        let count = 200
        for index in 0..<count {
            producer.send(topic: topic, key: nil, value: [1], slot: index, to: batcher)
            #expect(await reported.wait(atMost: .seconds(10)) { $0 > index }, "report \(index)")
        }
        await producer.close()
        let (first, last) = depths.withLock { ($0[0] ?? 0, $0[count - 1] ?? 0) }
        #expect(first > 0 && last - first < 8, "\(first) frames deep at the first report, \(last) at the last")
        withExtendedLifetime(cluster) {}
    }

    /// Records sent together have their delivery reports handed over together: one call per
    /// poll of the producer, not one per record (the relay ends a poll's worth of intents in one
    /// turn); each record's report comes once, with its slot. A record sent after `close()` is
    /// refused at once, alone.
    @Test func deliveryReportsComeABatchAtATime() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("outcomes")
        try cluster.createTopic(topic, partitions: 2)
        // A second's linger: the records go in a request or two per partition, however slowly
        // this machine appends them.
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers, properties: ["linger.ms": "1000"])
        try await producer.prepare(topics: [topic])
        let count = 500
        let calls = Locked<[Int]>([])
        let reports = Locked<[Int: Result<KafkaProducer.Delivery, KafkaError>]>([:])
        let twice = Locked<[Int]>([])
        let done = AsyncLatch()
        let batcher = producer.reportBatcher { batch in
            calls.withLock { $0.append(batch.count) }
            let all = reports.withLock { reports in
                for (slot, result) in batch where reports.updateValue(result, forKey: slot) != nil {
                    twice.withLock { $0.append(slot) }
                }
                return reports.count
            }
            if all == count { done.open() }
        }
        for index in 0..<count { producer.send(topic: topic, key: Array("\(index % 7)".utf8), value: [1], slot: index, to: batcher) }
        #expect(await done.wait(atMost: .seconds(30)), "every report came")
        #expect(reports.withLock { $0.values.allSatisfy { (try? $0.get()) != nil } })
        await producer.close()
        #expect(twice.withLock { $0 }.isEmpty, "reported twice (a late one included)")
        let batches = calls.withLock { $0 }
        #expect(batches.reduce(0, +) == count)
        // One call per poll that served a produce request's reports, not one per record.
        #expect(batches.count * 10 <= count, "\(batches.count) batches: \(batches)")

        let refused = Locked<[(Int, Bool)]>([])
        let late = producer.reportBatcher { batch in
            refused.withLock { $0 += batch.map { ($0.slot, (try? $0.result.get()) == nil) } }
        }
        producer.send(topic: topic, key: nil, value: [2], slot: 7, to: late)
        #expect(refused.withLock { $0.map(\.0) } == [7] && refused.withLock { $0.allSatisfy(\.1) }, "refused at once, on this thread")
    }

    /// A batched record's slot and batcher travel in its opaque pointer, beside records whose
    /// report goes to a closure (an object's address): two batchers on one producer each hear
    /// exactly their own slots, the largest slot included, and the closure its own report.
    @Test func slotsReachTheirOwnBatcherBesideOtherReports() async throws {
        let (cluster, topic, producer) = try await preparedProducer(partitions: 3)
        let heard = Locked<[Int: [Int]]>([:])
        let count = AsyncWatched(0)
        let batchers = (0..<2).map { which in
            producer.reportBatcher { batch in
                heard.withLock { $0[which, default: []] += batch.compactMap { (try? $0.result.get()) != nil ? $0.slot : nil } }
                count.update { $0 += batch.count }
            }
        }
        let slots = [[0, 1, 1 << 40, (1 << 47) - 1], [5, 1 << 20, (1 << 47) - 2]]
        let closure = AsyncLatch()
        for (which, own) in slots.enumerated() {
            for slot in own { producer.send(topic: topic, key: Array("\(slot)".utf8), value: [1], slot: slot, to: batchers[which]) }
            producer.send(topic: topic, key: nil, value: [2]) { if case .success = $0 { closure.open() } }
        }
        #expect(await count.wait(atMost: .seconds(30)) { $0 == 7 }, "every batched report came")
        #expect(await closure.wait(atMost: .seconds(30)), "the closure heard its report")
        await producer.close()
        #expect(heard.withLock { $0[0]?.sorted() } == slots[0].sorted())
        #expect(heard.withLock { $0[1]?.sorted() } == slots[1].sorted())
        withExtendedLifetime(cluster) {}
    }

    /// Several partitions' offsets go to librdkafka in one call; one this client does not know
    /// is named and the others are stored all the same (a revoked one is refused as well:
    /// `KafkaRebalanceTests.revokedPartitionsRefuseOffsets`, through the same call).
    @Test func offsetsOfSeveralPartitionsAreStoredInOneCall() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for partition in Int32(0)..<2 { _ = try await producer.send(topic: topic, partition: partition, key: nil, value: [1]) }
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic],
                                         properties: fastGroup)
        _ = try await collect(consumer) { messages, _ in messages.count >= 2 }
        let (zero, one) = (TopicPartition(topic: topic, partition: 0), TopicPartition(topic: topic, partition: 1))
        let elsewhere = TopicPartition(topic: topic + "-other", partition: 0)
        let before = consumer.offsetStoreCalls
        let failed = consumer.storeOffsets([(zero, 0), (elsewhere, 5), (one, 0)])
        #expect(consumer.offsetStoreCalls == before + 1)
        #expect(failed.map(\.0) == [elsewhere])
        try await consumer.commit()
        #expect(try await consumer.committed([zero, one]) == [zero: 1, one: 1])
        #expect(consumer.storeOffsets([]).isEmpty && consumer.offsetStoreCalls == before + 1, "nothing to store: no call")
        await consumer.close()
        await producer.close()
    }

    /// Clients dropped without `close()` while their brokers are gone: librdkafka's threads log
    /// the disconnects while `rd_kafka_destroy` runs, and topic handles outlive the producer's
    /// other state. Both once reached freed memory (a crash, not a failed expectation).
    @Test func clientsDroppedWhileTheirClusterIsGoneShutDownCleanly() async throws {
        for _ in 0..<3 {
            var cluster: KafkaMockCluster? = try KafkaMockCluster(brokers: 1)
            let topic = uniqueName("outcomes")
            try cluster!.createTopic(topic, partitions: 1)
            var producer: KafkaProducer? = try KafkaProducer(bootstrapServers: cluster!.bootstrapServers,
                                                             properties: ["message.timeout.ms": "1000"])
            var consumer: KafkaConsumer? = try KafkaConsumer(bootstrapServers: cluster!.bootstrapServers, groupID: uniqueName("group"),
                                                             topics: [topic], properties: fastGroup)
            _ = try await producer!.send(topic: topic, key: nil, value: [1])
            let (messages, _) = try await collect(consumer!) { messages, _ in !messages.isEmpty }
            #expect(messages.count == 1)
            // Their destruction really ran (nothing kept them): a crash or ASan would say how.
            weak let droppedProducer = producer, droppedConsumer = consumer
            cluster = nil
            producer = nil
            consumer = nil
            try await waitUntil { droppedProducer == nil && droppedConsumer == nil }
        }
    }

    @Test func lagIsKnownForRecordsProducedAfterTheAssignment() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic], properties: fastGroup)
        _ = try await collect(consumer) { _, events in events.contains { if case .assigned = $0 { return true }; return false } }
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for index in 0..<10 { _ = try await producer.send(topic: topic, key: Array("k\(index)".utf8), value: [1]) }
        _ = try await collect(consumer) { messages, _ in messages.count >= 10 }
        try await waitUntil { consumer.lag.count == 2 }
        #expect(consumer.lag.values.allSatisfy { $0 == 0 })
        await producer.close()
        await consumer.close()
    }

    @Test func badSettingsAreNamed() {
        do {
            _ = try KafkaProducer(bootstrapServers: "127.0.0.1:1", properties: ["no.such.setting": "1"])
            Issue.record("an unknown setting was accepted")
        } catch {
            #expect(error.description.contains("no.such.setting"))
        }
    }
}

/// Rebalances, one test at a time: several mock clusters' coordinators at once on two loaded
/// cores can stretch a rebalance into the next one, which these tests do not expect.
@Suite("Kafka rebalances over librdkafka's mock cluster", .serialized, .timeLimit(.minutes(3)))
struct KafkaRebalanceTests {
    /// With librdkafka's auto-commit off, a partition taken away by a rebalance has its stored
    /// offset committed before it goes: its next owner starts exactly behind the work finished
    /// here.
    @Test func aRevokedPartitionsStoredOffsetIsCommittedBeforeItMoves() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        let group = uniqueName("group")
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        var produced: [Int32: Int64] = [:]
        for index in 0..<60 {
            let delivery = try await producer.send(topic: topic, key: Array("k\(index)".utf8), value: Array("\(index)".utf8))
            produced[delivery.partition, default: 0] += 1
        }
        await producer.close()
        #expect(produced.count == 2)
        // A session that survives a loaded machine: only the second member's join rebalances.
        let manual = ["session.timeout.ms": "10000", "heartbeat.interval.ms": "500", "enable.auto.commit": "false"]
        let first = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: manual)
        let (messages, _) = try await collect(first) { messages, _ in messages.count >= 60 }
        // Everything is finished here; nothing is committed yet (auto-commit is off).
        for message in messages { try first.storeOffset(message.topicPartition, offset: message.offset) }
        let partitions = (0..<2).map { TopicPartition(topic: topic, partition: $0) }
        #expect(try await first.committed(partitions).values.allSatisfy { $0 < 0 })

        // A second member joins: one partition moves to it.
        let second = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: manual)
        async let joined = collect(second) { _, events in
            events.contains { if case .assigned(let assigned) = $0 { return !assigned.isEmpty }; return false }
        }
        let (_, events) = try await collect(first, timeout: .seconds(60)) { _, events in
            events.contains { if case .revoked(let revoked) = $0 { return !revoked.isEmpty }; return false }
        }
        let revoked = events.compactMap { event -> [TopicPartition]? in
            if case .revoked(let partitions) = event { return partitions }
            return nil
        }.flatMap { $0 }
        #expect(revoked.count == 1)
        let committed = try await first.committed(revoked)
        // The mock coordinator refuses commits while the group is joining or syncing (real
        // Kafka accepts them while preparing a rebalance): a refusal is counted, and only then
        // is a missing commit a known issue of the test cluster.
        withKnownIssue("the mock coordinator refused the revocation's commit", isIntermittent: true) {
            for partition in revoked {
                #expect(committed[partition] == produced[partition.partition], "\(partition)")
            }
        } when: {
            first.revocationCommitFailures > 0
        }
        _ = try await joined
        await second.close()
        await first.close()
    }

    /// A member of a fresh group that consumed all 40 records of a 4-partition topic, then a
    /// second member that joins: `beforeJoin` runs between the two. Returns both consumers,
    /// what the first consumed and the partitions revoked from it (once the second has some).
    static func rebalance(_ cluster: KafkaMockCluster, properties: [String: String],
                          beforeJoin: (KafkaConsumer, [KafkaMessage]) async throws -> Void = { _, _ in })
        async throws -> (first: KafkaConsumer, second: KafkaConsumer, consumed: [KafkaMessage], revoked: [TopicPartition]) {
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 4)
        let group = uniqueName("group")
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for index in 0..<40 { _ = try await producer.send(topic: topic, key: Array("k\(index)".utf8), value: [1]) }
        await producer.close()
        let first = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: properties)
        let (messages, _) = try await collect(first) { messages, _ in messages.count >= 40 }
        try await beforeJoin(first, messages)
        let second = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: properties)
        let secondAssigned = Task { try await collect(second) { _, events in events.contains { if case .assigned(let p) = $0 { return !p.isEmpty }; return false } } }
        let (_, events) = try await collect(first) { _, events in events.contains { if case .revoked(let p) = $0 { return !p.isEmpty }; return false } }
        _ = try await secondAssigned.value
        let revoked = events.compactMap { if case .revoked(let p) = $0 { return p }; return nil }.flatMap { $0 }
        return (first, second, messages, revoked)
    }

    @Test func revokedPartitionsRefuseOffsets() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let (first, second, messages, revoked) = try await Self.rebalance(cluster, properties: fastGroup)
        #expect(messages.count == 40)
        #expect(!revoked.isEmpty)
        let old = try #require(messages.first { revoked.contains($0.topicPartition) })
        #expect(throws: KafkaError.self) { try first.storeOffset(old.topicPartition, offset: old.offset) }
        await first.close()
        await second.close()
    }

    /// A revocation whose commit the coordinator refuses is counted (the partition's next
    /// owner starts from the last commit: what was finished since is sent again), so that the
    /// relay can show it.
    @Test func aRevocationWhoseCommitIsRefusedIsCounted() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let manual = fastGroup.merging(["enable.auto.commit": "false"]) { $1 }
        let (first, second, _, revoked) = try await Self.rebalance(cluster, properties: manual) { first, messages in
            for message in messages { try first.storeOffset(message.topicPartition, offset: message.offset) }
            #expect(first.revocationCommitFailures == 0)
            cluster.failRequests(apiKey: KafkaMockCluster.APIKey.offsetCommit, errorCode: KafkaErrorCode.groupAuthorizationFailed)
        }
        #expect(!revoked.isEmpty)
        #expect(first.revocationCommitFailures == 1)
        cluster.restoreRequests(apiKey: KafkaMockCluster.APIKey.offsetCommit)
        await first.close()
        await second.close()
    }
}

@Suite("librdkafka's statistics", .timeLimit(.minutes(2)))
struct KafkaStatisticsTests {
    /// Both clients hear their statistics: the mock cluster's brokers by node id (up), the
    /// producer's queue, the consumer's assigned partitions being fetched; a broker taken down
    /// is seen down.
    @Test func statisticsNameBrokersQueueAndFetchState() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = "stats.\(UUID().uuidString.prefix(8))"
        try cluster.createTopic(topic, partitions: 2)
        let heard = Locked<[String: KafkaStatistics]>([:])
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers, properties: ["statistics.interval.ms": "100"])
        producer.onStatistics { statistics in heard.withLock { $0["producer"] = statistics } }
        _ = try await producer.send(topic: topic, key: Array("k".utf8), value: Array("v".utf8))
        let consumer = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: "stats-\(UUID())", topics: [topic],
                                         properties: ["statistics.interval.ms": "100", "session.timeout.ms": "6000"])
        consumer.onStatistics { statistics in heard.withLock { $0["consumer"] = statistics } }
        let running = Task { await consumer.run() }
        try await waitUntil(timeout: .seconds(30)) {
            heard.withLock { $0["consumer"]?.partitions.filter { $0.fetchState == "active" }.count == 2 && $0["producer"] != nil }
        }
        let (produced, consumed) = heard.withLock { ($0["producer"]!, $0["consumer"]!) }
        #expect(produced.type == "producer" && consumed.type == "consumer")
        #expect(produced.brokers.count == 1 && produced.brokers.allSatisfy(\.isUp), "\(produced.brokers)")
        #expect(consumed.brokers.allSatisfy(\.isUp) && !consumed.brokers.isEmpty, "\(consumed.brokers)")
        #expect(produced.queuedMessages == 0)
        #expect(Set(consumed.partitions.map(\.topic)) == [topic])
        await cluster.setBroker(1, up: false)
        try await waitUntil(timeout: .seconds(30)) { heard.withLock { $0["consumer"]?.brokers.contains(where: \.isUp) == false } }
        await cluster.setBroker(1, up: true)
        running.cancel()
        await consumer.close()
        await producer.close()
    }

    @Test func whatIsNotStatisticsIsNil() {
        for text in ["", "[]", "{}", #"{"brokers":{}}"#] {
            let bytes = Array(text.utf8)
            #expect(bytes.withUnsafeBytes { KafkaStatistics(json: $0) } == nil, "\(text)")
        }
    }
}

@Suite("Closing consumers while their group rebalances", .timeLimit(.minutes(3)))
struct KafkaCloseDuringRebalanceTests {
    /// Members of a group closed together while the group is still handing out partitions, with
    /// lanes' topic queues and a revocation handler that takes a moment, as in the relay: each
    /// leaves cleanly. librdkafka 2.0.2 aborted the test process here (in
    /// `rd_kafka_sticky_assignor_state_destroy` for a cooperative-sticky member closed between
    /// its join and its first sync; with `range`, once in a full relay test, in
    /// `rd_kafka_cgrp_terminated`) before ``KafkaConsumer/close()`` left the group first.
    @Test(arguments: ["range", "cooperative-sticky"])
    func membersClosedDuringARebalanceLeaveCleanly(assignor: String) async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topics = [uniqueName("urgent"), uniqueName("bulk")]
        for topic in topics { try cluster.createTopic(topic, partitions: 4) }
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for index in 0..<200 { _ = try await producer.send(topic: topics[index % 2], key: Array("k\(index)".utf8), value: [1]) }
        await producer.close()
        let properties = fastGroup.merging(["partition.assignment.strategy": assignor, "enable.auto.commit": "false"]) { $1 }
        for _ in 0..<6 {
            let group = uniqueName("group")
            let members = try (0..<4).map { _ in
                try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: topics, properties: properties,
                                  topicQueues: true)
            }
            // As the relay does: a revocation lets the work under way finish first.
            for member in members { member.onRevoking { _, _ in usleep(20_000) } }
            let firstAssignment = AsyncLatch()
            let draining = members.map { member in
                Task {
                    for await event in member.events {
                        if case .assigned(let assigned) = event, !assigned.isEmpty { firstAssignment.open() }
                        if case .messages(let batch) = event {
                            for message in batch { try? member.storeOffset(message.topicPartition, offset: message.offset) }
                            member.release(topic: batch[0].topicPartition.topic, records: batch.count)
                        }
                    }
                }
            }
            // The first assignment anywhere: the others are joining, the group rebalances.
            #expect(await firstAssignment.wait(atMost: .seconds(30)))
            await withTaskGroup(of: Void.self) { closing in
                for member in members { closing.addTask { await member.close() } }
            }
            for task in draining { await task.value }
            for member in members { #expect(member.assignment.isEmpty) }
        }
    }

    /// A member closed after its join was answered and before its first sync came back (the
    /// coordinator answers its SyncGroup late, past the close's wait for it): librdkafka 2.0.2
    /// aborts the process when it destroys such a member (`rd_kafka_sticky_assignor_state_destroy`:
    /// the cooperative-sticky assignor has no state before a first assignment). The close
    /// leaves that member's client undestroyed, and the process goes on. An eager assignor keeps
    /// no such state: its member is destroyed as usual.
    @Test(arguments: ["cooperative-sticky", "range"])
    func aMemberClosedBetweenItsJoinAndItsFirstSyncDoesNotAbortTheProcess(assignor: String) async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        // Late by far more than the close takes to leave the group, even on a loaded machine (the
        // close then waits for the late answer before the client is closed).
        cluster.pushBrokerRequestErrors(broker: 1, apiKey: KafkaMockCluster.APIKey.syncGroup, [(code: 0, delayMilliseconds: 15_000)])
        do {
            let member = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic],
                                           properties: fastGroup.merging(["partition.assignment.strategy": assignor]) { $1 },
                                           firstSyncTimeout: .milliseconds(200))
            member.start()
            // Joined, and its SyncGroup at the coordinator.
            let joinedAs = assignor == "range" ? "EAGER" : "COOPERATIVE"
            try await waitUntil(timeout: .seconds(30)) {
                member.rebalanceProtocol == joinedAs && cluster.brokerErrorsLeft(broker: 1, apiKey: KafkaMockCluster.APIKey.syncGroup) == 0
            }
            await member.close()
            #expect(member.assignment.isEmpty)
            #expect(member.clientLeftUndestroyed == (assignor == "cooperative-sticky"))
        }
        // The member is gone here: had its client been destroyed, the process would have aborted.
        // A member whose sync came back is destroyed as usual.
        let synced = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: uniqueName("group"), topics: [topic],
                                       properties: fastGroup)
        _ = try await collect(synced) { _, events in events.contains { if case .assigned = $0 { true } else { false } } }
        await synced.close()
        #expect(!synced.clientLeftUndestroyed)
    }

    /// Members that hold no partition (more members than partitions) closed while a later
    /// rebalance is under way (a new member joined after the group had settled): each leaves
    /// cleanly, and the members that stay get every partition. The close of a member that
    /// completed its first sync long ago does not wait for a first assignment; it leaves while
    /// its poll thread serves the rebalance.
    @Test(arguments: ["range", "cooperative-sticky"])
    func membersWithoutPartitionsClosedDuringALaterRebalanceLeaveCleanly(assignor: String) async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 2)
        let properties = fastGroup.merging(["partition.assignment.strategy": assignor, "enable.auto.commit": "false"]) { $1 }
        for _ in 0..<4 {
            let group = uniqueName("group")
            func member() throws -> KafkaConsumer {
                try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: properties)
            }
            /// Serves a member's events; `assigned` follows what it holds.
            func serve(_ member: KafkaConsumer, _ assigned: HeldPartitions) -> Task<Void, Never> {
                Task {
                    for await event in member.events {
                        switch event {
                        case .assigned(let partitions): assigned.add(partitions)
                        case .revoked(let partitions): assigned.remove(partitions)
                        default: break
                        }
                    }
                }
            }
            let members = try (0..<4).map { _ in try member() }
            let held = members.map { _ in HeldPartitions() }
            let serving = zip(members, held).map { serve($0, $1) }
            // Settled: the two partitions held, by two of the four members.
            try await waitUntil(timeout: .seconds(60)) {
                held.map(\.all.count).reduce(0, +) == 2 && held.filter(\.all.isEmpty).count == 2
            }
            let idle = zip(members, held).filter { $0.1.all.isEmpty }.map(\.0)
            let busy = zip(members, held).filter { !$0.1.all.isEmpty }
            // A fifth member joins: the group rebalances, and the idle ones close at once,
            // while it does.
            let late = try member()
            let lateHeld = HeldPartitions()
            let lateServing = serve(late, lateHeld)
            await withTaskGroup(of: Void.self) { closing in
                for member in idle { closing.addTask { await member.close() } }
            }
            for member in idle { #expect(member.assignment.isEmpty) }
            // The three that stay hold both partitions between them, once the group settles.
            try await waitUntil(timeout: .seconds(60)) {
                (busy.map(\.1) + [lateHeld]).reduce(into: Set<TopicPartition>()) { $0.formUnion($1.all) }.count == 2
            }
            await withTaskGroup(of: Void.self) { closing in
                for member in busy.map(\.0) + [late] { closing.addTask { await member.close() } }
            }
            for task in serving + [lateServing] { await task.value }
        }
    }
}

/// The partitions a member holds, as its events say.
final class HeldPartitions: Sendable {
    private let held = Locked(Set<TopicPartition>())
    var all: Set<TopicPartition> { held.withLock { $0 } }
    func add(_ partitions: [TopicPartition]) { held.withLock { $0.formUnion(partitions) } }
    func remove(_ partitions: [TopicPartition]) { held.withLock { $0.subtract(partitions) } }
}

@Suite("Records and rebalances in order", .timeLimit(.minutes(2)))
struct KafkaEventOrderTests {
    /// Review 4.3: records the poll thread collected before a rebalance callback reach the
    /// application before that rebalance's event, never after it: a record of a partition comes
    /// only while the events say the partition is assigned. (librdkafka 2.0.2 stops returning
    /// records before it serves a revocation in every run so far, so this guards the order the
    /// consumer now keeps by construction rather than showing a failure seen.)
    @Test(arguments: ["range", "cooperative-sticky"])
    func noRecordOfAPartitionArrivesWhileItIsNotAssigned(assignor: String) async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let topic = uniqueName("intents")
        try cluster.createTopic(topic, partitions: 4)
        // A backlog the first member is still reading when the group rebalances.
        let producer = try KafkaProducer(bootstrapServers: cluster.bootstrapServers)
        for chunk in 0..<20 {
            _ = try await producer.send(topic: topic, records: (0..<2000).map { index in
                (key: Array("k\(chunk * 2000 + index)".utf8), value: [UInt8](repeating: 1, count: 4096))
            })
        }
        await producer.close()
        let group = uniqueName("group")
        let properties = fastGroup.merging(["partition.assignment.strategy": assignor]) { $1 }
        let first = try KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic], properties: properties,
                                      maxBatch: 500, bufferedMessages: 100_000)
        let joined = AsyncLatch()
        let second = Locked<KafkaConsumer?>(nil)
        let (_, events) = try await collect(first, timeout: .seconds(60)) { messages, events in
            if !messages.isEmpty, !joined.isOpen {
                joined.open()
                // A second member joins while the first one's poll thread is collecting records.
                second.withLock { $0 = try? KafkaConsumer(bootstrapServers: cluster.bootstrapServers, groupID: group, topics: [topic],
                                                          properties: properties) }
                second.withLock { $0 }?.start()
            }
            return events.contains { if case .revoked(let revoked) = $0 { return !revoked.isEmpty }; return false }
                && events.last.map { if case .assigned = $0 { return true }; return false } == true
        }
        var assigned: Set<TopicPartition> = []
        var strays: [String] = []
        for event in events {
            switch event {
            case .assigned(let partitions): assigned.formUnion(partitions)
            case .revoked(let partitions): assigned.subtract(partitions)
            case .messages(let batch):
                for message in batch where !assigned.contains(message.topicPartition) {
                    strays.append("\(message.topicPartition)@\(message.offset)")
                }
            default: break
            }
        }
        #expect(strays.isEmpty, "\(strays.count) records of unassigned partitions, first \(strays.prefix(5))")
        await first.close()
        await second.withLock { $0 }?.close()
    }
}
