import APNs
import Benchmark
import Common
import Crypto
import Foundation
import Kafka
import NIOCore
import Redis
import Relay
import RelayCore

/// The per-intent steps measured alone: time and allocations each (docs/performance.md keeps
/// the baselines). `swift package benchmark --target RelayBenchmarks` runs them; CI builds them
/// and never times them.
let benchmarks: @Sendable () -> Void = {
    // A thousand calls per sample: the runner's own work per sample (16 allocations, counted
    // with the step's) is then 0.016 per call, and the figures are per call (scaled).
    Benchmark.defaultConfiguration = .init(metrics: [.wallClock, .cpuTotal, .mallocCountTotal, .throughput],
                                           scalingFactor: .kilo, maxDuration: .seconds(3), maxIterations: 1_000_000)
    // scripts/check-allocations: allocations only, which repeat exactly, so three samples do.
    if ProcessInfo.processInfo.environment["APNS_RELAY_ALLOCATIONS_ONLY"] == "1" {
        Benchmark.defaultConfiguration = .init(metrics: [.mallocCountTotal], scalingFactor: .kilo, maxDuration: .seconds(10),
                                               maxIterations: 3)
    }

    let token = String(repeating: "7a3e", count: 16)
    let intent = Array(#"""
        {"id":"order-shipped-123","token":"\#(token)","topic":"com.example.app","push_type":"alert","priority":10,
         "collapse_id":"chat-42","payload":{"aps":{"alert":{"title":"Shipped","body":"Your order is on its way"},"sound":"default"},
         "order":"123","links":["https://example.com/o/123"]}}
        """#.utf8)

    Benchmark("Intent parse and validation") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try? Intent.parse(intent, key: nil, now: 1_700_000_000, defaultTTL: 86_400))
        }
    }

    Benchmark("Outcome encode") { benchmark in
        var outcome = Outcome(id: "order-shipped-123", token: token, topic: "com.example.app", status: .delivered, httpStatus: 200,
                              apnsID: "5e4c7a9f-7e6b-4b3a-9c1d-2f8e6a5b4c3d", attempts: 1, latencyMilliseconds: 12,
                              lane: "apns.intents", partition: 3, offset: 1042, worker: "relay-7d9f-1", at: 1_732_000_000_456)
        outcome.badge = nil
        for _ in benchmark.scaledIterations {
            blackHole(outcome.utf8)
        }
    }

    // An intent's offset through its partition's ledger, as admission starts it and its end
    // finishes it (in order, so each finish moves the committable offset).
    Benchmark("Partition ledger: an offset started and finished") { benchmark in
        var ledger = PartitionLedger<TopicPartition>()
        let partition = TopicPartition(topic: "apns.intents", partition: 3)
        ledger.assign([partition])
        let generation = ledger.generation(of: partition) ?? 0
        var offset: Int64 = 0
        for _ in benchmark.scaledIterations {
            blackHole(ledger.start(partition, offset: offset, generation: generation))
            blackHole(ledger.finish(partition, generation: generation, offset: offset))
            offset += 1
        }
    }

    // A device's two intents through its queue, as the pipeline moves them: the first starts,
    // the second queues behind it, the first's turn ends (the second starts) and its slot is
    // freed, then the second's; 64 devices in turn, so that queues are emptied and taken again
    // from the spares. Per call: one intent. The items are made, and the queues' tables grown,
    // before the measurement starts.
    let parsed = try! Intent.parse(intent, key: nil, now: 1_700_000_000, defaultTTL: 86_400)
    let queuedPairs = (0..<64).map { device in
        let token = String(format: "%064x", device)
        return (QueuedIntent(parsed, token: token, partition: 0), QueuedIntent(parsed, token: token, partition: 0))
    }
    func moveThrough(_ queues: inout DeviceQueues<QueuedIntent>, _ first: QueuedIntent, _ second: QueuedIntent) {
        blackHole(queues.enqueue(first))
        blackHole(queues.enqueue(second))
        blackHole(queues.nextQueued(after: first, (first.queueToken!, false), parkedUntil: [:]))
        queues.answerFreed(by: first)
        blackHole(queues.nextQueued(after: second, (second.queueToken!, false), parkedUntil: [:]))
        queues.answerFreed(by: second)
    }
    Benchmark("Device queues: an intent queued, its turn ended") { benchmark in
        var queues = DeviceQueues<QueuedIntent>()
        for (first, second) in queuedPairs { moveThrough(&queues, first, second) }
        benchmark.startMeasurement()
        for call in 0..<(benchmark.scaledIterations.count / 2) {
            let (first, second) = queuedPairs[call % queuedPairs.count]
            moveThrough(&queues, first, second)
        }
    }

    // One intent through its shard's state, the steps the pipeline takes for an intent driven
    // by callbacks, in its order, with the I/O left out (Kafka, APNs and the clock are stubs:
    // fixed bytes, a 200, fixed times): parsed from its record, its offset started in its
    // partition's ledger, queued behind its device's earlier intents, its delivery state
    // machine made and told the attempt is due, its send counted at APNs, its request and
    // headers built, the 200 given to the machine, its send no longer counted, its outcome made
    // and encoded as `makeOutcome` does, kept in the shard's slot table until its delivery
    // report and taken back, its device's turn ended and its answer freed, its offset finished.
    // 64 devices in turn. What it leaves out: the relay's own per-intent objects around these
    // steps (its work item and delivery, internal to the Relay module), the locks, and the
    // clients' buffers; `bench e2e` counts the whole intent with its I/O
    // (`allocations_per_intent`, docs/performance.md).
    let shardRecords = (0..<64).map { device in
        Array(String(decoding: intent, as: UTF8.self).replacingOccurrences(of: token, with: String(format: "%064x", device)).utf8)
    }
    let noJitter = Backoff(base: .milliseconds(500), maximum: .seconds(30), jitter: false)
    let answer = APNsResult(status: 200, reason: nil, apnsID: "5e4c7a9f-7e6b-4b3a-9c1d-2f8e6a5b4c3d", timestamp: nil, attempts: 1)
    struct ShardState {
        var partitions = PartitionLedger<TopicPartition>()
        var queues = DeviceQueues<QueuedIntent>()
        var concluding = SlotTable<QueuedIntent>()
        var offset: Int64 = 0
    }
    let shardPartition = TopicPartition(topic: "apns.intents", partition: 3)
    func throughShard(_ shard: inout ShardState, _ record: [UInt8], generation: Int) {
        guard let parsed = try? Intent.parse(record, key: nil, now: 1_700_000_000, defaultTTL: 86_400) else { fatalError("the intent parses") }
        let offset = shard.offset
        shard.offset += 1
        blackHole(shard.partitions.start(shardPartition, offset: offset, generation: generation))
        let item = QueuedIntent(parsed, partition: shardPartition.partition)
        blackHole(shard.queues.enqueue(item))
        var machine = DeliveryStateMachine(expiration: parsed.expiration,
                                           limits: .init(retryDeadline: 1_700_000_600, canPark: false, parkAfterDeadlineMilliseconds: 0),
                                           backoff: noJitter)
        guard machine.attemptDue(now: 1_700_000_000, isOwned: true, hasCredentials: true) == .send else { fatalError("a send is due") }
        blackHole(shard.partitions.sendBegins(shardPartition, generation: generation, first: true))
        let notification = parsed.notification
        blackHole(APNsClient.request(for: notification, apnsID: APNsIdentifiers.format(notification.apnsID), authority: "api.push.apple.com"))
        guard machine.answered(answer, now: 1_700_000_000, nowMilliseconds: 1_700_000_000_012) == .finish else { fatalError("a 200 ends it") }
        shard.partitions.sentWorkEnded(shardPartition, generation: generation)
        var outcome = Outcome(id: parsed.id, token: parsed.token, topic: parsed.topic, status: .delivered, reason: nil, attempts: machine.attempts,
                              latencyMilliseconds: 12, lane: shardPartition.topic, partition: shardPartition.partition, offset: offset,
                              worker: "relay-7d9f-1", at: 1_700_000_000_012)
        outcome.httpStatus = answer.status
        outcome.apnsID = answer.apnsID
        outcome.metadata = parsed.metadata
        outcome.collapseID = parsed.collapseID
        blackHole(outcome.utf8)
        let slot = shard.concluding.insert(item)
        blackHole(shard.concluding.remove(slot))
        blackHole(shard.queues.nextQueued(after: item, (parsed.token, false), parkedUntil: [:]))
        shard.queues.answerFreed(by: item)
        blackHole(shard.partitions.finish(shardPartition, generation: generation, offset: offset))
    }
    Benchmark("An intent through its shard's state, I/O stubbed") { benchmark in
        var shard = ShardState()
        shard.partitions.assign([shardPartition])
        let generation = shard.partitions.generation(of: shardPartition) ?? 0
        // The tables grown, and the devices' queues made and spared, before the measurement.
        for record in shardRecords { throughShard(&shard, record, generation: generation) }
        benchmark.startMeasurement()
        for call in benchmark.scaledIterations {
            throughShard(&shard, shardRecords[call % shardRecords.count], generation: generation)
        }
    }

    // An admission batch as the pipeline asks it: per device one MGET of its bucket, backoff,
    // mailbox ids and one dedupe record, each key written straight into the command's bytes
    // as the pipeline's key writers do (no string per key).
    let devices = (0..<128).map { String(format: "%064x", $0) }
    func key(_ bytes: inout [UInt8], _ kind: String, _ device: String, _ rest: String = "") {
        bytes.append(contentsOf: "apns-relay:".utf8)
        bytes.append(contentsOf: kind.utf8)
        bytes.append(contentsOf: ":{".utf8)
        bytes.append(contentsOf: device.utf8)
        bytes.append(UInt8(ascii: "}"))
        bytes.append(contentsOf: rest.utf8)
    }
    Benchmark("RESP encode: a batch's admission reads (128 devices)") { benchmark in
        for _ in benchmark.scaledIterations {
            var reads = RedisCommandBuffer(reservingBytes: 256 * devices.count)
            for device in devices {
                reads.append("MGET") { command in
                    command.appendArgument { key(&$0, "rate", device) }
                    command.appendArgument { key(&$0, "backoff", device) }
                    command.appendArgument { key(&$0, "waiting", device, ":com.example.app") }
                    command.appendArgument { key(&$0, "seen", device, ":com.example.app:order-shipped-123") }
                }
            }
            blackHole(reads.encodedByteCount)
        }
    }

    // A batch's intents grouped by device and each group decided, as the policy's admission
    // does between its read and its answer (one intent per device: the common case, where each
    // group's arrays were allocations of their own).
    let batch: [Result<Intent, InvalidIntent>] = devices.map { device in
        Result { () throws(InvalidIntent) -> Intent in
            try Intent.parse(Array(#"{"id":"order-shipped-123","token":"\#(device)","topic":"com.example.app","payload":{"aps":{}}}"#.utf8),
                             key: nil, now: 1_700_000_000, defaultTTL: 86_400)
        }
    }
    let rules = RelayConfiguration.Policy.Rules()
    Benchmark("Policy admission: a batch grouped and decided (128 devices)") { benchmark in
        for _ in benchmark.scaledIterations {
            var groups: [DeviceAdmission.Group] = [], members: [[Int]] = []
            groups.reserveCapacity(devices.count)
            members.reserveCapacity(devices.count)
            BatchAdmission.group(batch, rules: { _, _ in rules }, groups: &groups, members: &members)
            for group in groups {
                var bucket = DeviceAdmission.Bucket(rules.rateLimit, stored: nil, now: 1_700_000_000_000)
                blackHole(DeviceAdmission.decide(group, waiting: nil, backoffUntil: 0, bucket: &bucket, now: 1_700_000_000_000) { _ in nil })
            }
        }
    }

    // Their answers: for each device four values, one of them a record.
    var replies = ByteBuffer()
    for _ in devices {
        replies.writeString("*4\r\n:1732000000123\r\n$-1\r\n$-1\r\n$32\r\ndelivered 200 5e4c7a9f7e6b4b3a9c\r\n")
    }
    Benchmark("RESP decode: a batch's admission replies (128 devices)") { benchmark in
        for _ in benchmark.scaledIterations {
            let decoder = RESPDecoder()
            try decoder.feed(replies)
            while let value = try decoder.next() { blackHole(value) }
        }
    }

    let signer = ProviderTokenSigner(teamID: "TEAM123456", keyID: "ABC123DEFG", key: P256.Signing.PrivateKey())
    Benchmark("Provider token signing (ES256)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try signer.mint(issuedAt: 1_732_000_000))
        }
    }

    let notification = try! Intent.parse(intent, key: nil, now: 1_700_000_000, defaultTTL: 86_400).notification
    let apnsID = APNsIdentifiers.format(notification.apnsID)
    Benchmark("Request and headers built") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(APNsClient.request(for: notification, apnsID: apnsID, authority: "api.push.apple.com"))
        }
    }
}

/// An intent as ``DeviceQueues`` sees it, without the relay's work item (its Kafka partition,
/// trace and policy fields): what the queues cost alone.
final class QueuedIntent: DeviceQueueItem {
    let lane = 0
    let partitionNumber: Int32
    let admission: BatchAdmission.Admission
    let intent: Result<Intent, InvalidIntent>
    let mailboxMember: String? = nil
    let holdsAnswer = true
    let queueToken: String?

    init(_ intent: Intent, token: String, partition: Int32, admission: BatchAdmission.Admission = .send) {
        var intent = intent
        intent.token = token
        self.intent = .success(intent)
        self.partitionNumber = partition
        self.admission = admission
        self.queueToken = token
    }

    /// For the intent's own device (its storage not copied, as the relay's work item does not).
    init(_ intent: Intent, partition: Int32) {
        self.intent = .success(intent)
        self.partitionNumber = partition
        self.admission = .send
        self.queueToken = intent.token
    }

    func withAdmission(_ admission: BatchAdmission.Admission) -> QueuedIntent {
        guard case .success(let intent) = intent else { return self }
        return QueuedIntent(intent, token: queueToken ?? intent.token, partition: partitionNumber, admission: admission)
    }
}
