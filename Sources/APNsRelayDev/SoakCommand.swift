import APNs
import APNsSimulator
import ArgumentParser
import CommandLineSupport
import Foundation
import Kafka
import KafkaTesting
import Relay
import RedisTesting
import Spawn
import Common

/// `apns-relay-dev soak`: relay processes (`apns-relay run`, next to this executable) under a
/// steady load while faults come one after another — a relay killed with SIGKILL and started
/// again, redis-server killed and started again (AOF, fsync always), APNs stalling (no answers),
/// a storm of 503s, a broker outage (every produce and fetch refused) — ending with one verdict
/// line: intents, outcomes, missing, wrong, sends that reached APNs twice and the bound they must
/// stay within.
///
/// The mock Kafka cluster, the simulator and redis-server run apart from the relays (this
/// process and its child), as a broker, APNs and Redis would. By default every intent has a
/// device of its own, so each must end `delivered`, or `duplicate` of a delivered one after a
/// redelivery. With `--devices N` the intents share N devices, each increments its device's
/// badge, and every fifth goes to an urgent lane (weight 8) beside the bulk one: devices then
/// reach their rate limit, park and have their parked intents superseded (`coalesced`), and
/// the verdict checks what must hold all the same — every intent has exactly one status that
/// is not `duplicate` (`delivered`, or `coalesced` if APNs never accepted it), or only
/// `duplicate`s of one such (below), a `delivered` one only if APNs took it, each device's
/// notifications reach APNs in order within a lane, and no device's badge goes down. In both
/// modes every outcome must name its own intent's lane, partition and offset.
/// Sends twice are allowed where the relay cannot know better: the intents it had at APNs when
/// it was killed (at most `--max-in-flight` per kill) and the sends APNs took in without
/// answering while it stalled; an intent APNs accepted that a redelivery then answered
/// `coalesced` counts against the same bound. So does an intent whose only outcomes are
/// `duplicate`s of a right answer (of `delivered`, only if APNs took it): its answer was recorded
/// in Redis and its outcome not yet published when its relay was killed.
struct SoakCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak",
        abstract: "Relay processes under steady load through kill -9s, Redis restarts, APNs stalls and 503 storms, broker outages; prints one verdict line.")

    @Option(help: "How long the load runs, in seconds (faults included); then the relays finish what is left.")
    var seconds: Int = 300

    @Option(help: "Relay processes.")
    var relays: Int = 2

    @Option(help: "Intents produced per second.")
    var rate: Int = 100

    @Option(help: "Seconds between two faults.")
    var faultEvery: Int = 15

    @Option(help: "Each relay's limits.max_in_flight.")
    var maxInFlight: Int = 50

    @Option(help: "Devices the intents share, with badge increments and an urgent lane (0: a device per intent).")
    var devices: Int = 0

    func validate() throws {
        if seconds < 10 || relays < 1 || rate < 1 || faultEvery < 5 || maxInFlight < 1 || devices < 0 {
            throw ValidationError("--seconds ≥ 10, --relays ≥ 1, --rate ≥ 1, --fault-every ≥ 5, --max-in-flight ≥ 1 and --devices ≥ 0")
        }
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let relayBinary = try siblingExecutable("apns-relay")
        let stack = try await EmbeddedStack.start(partitions: 8) { $0.recordInMemory = true }
        let soak: Soak
        do {
            soak = try Soak(stack: stack, relayBinary: relayBinary, relays: relays, maxInFlight: maxInFlight, devices: devices)
        } catch {
            Terminal.error("cannot start the soak: \(error)")
            await stack.stop()
            throw ExitCode(1)
        }
        let verdict = await soak.run(seconds: seconds, rate: rate, faultEvery: faultEvery)
        Terminal.line(verdict.line)
        let stopped = await soak.stop(keepingLogs: !verdict.passed)
        if !stopped { Terminal.error("a relay did not stop within 30 s of SIGTERM: killed") }
        if !verdict.passed { Terminal.error("the relays' logs stay in \(stack.directory.path)") }
        if !verdict.passed || !stopped { throw ExitCode(1) }
    }
}

struct SoakError: Error, CustomStringConvertible {
    var description: String
}

/// One soak: the stack, redis-server, the relay processes and what was seen.
final class Soak: Sendable {
    enum Fault: String, CaseIterable {
        case killRelay = "kill -9"
        case restartRedis = "Redis restart"
        case pauseRedis = "Redis pause"
        case stallAPNs = "APNs stall"
        case storm503 = "503 storm"
        case brokerOutage = "broker outage"
    }

    struct Verdict {
        var line: String
        var passed: Bool
    }

    struct Seen {
        var produced = Set<String>()
        /// Where each produced intent landed: `<topic> <partition>/<offset>`.
        var landed: [String: String] = [:]
        /// Per intent id, where its outcomes said it came from (`lane`, `partition`, `offset`).
        var named: [String: Set<String>] = [:]
        var produceFailures = 0
        /// Reported delivered by the soak's producer (without an offset) yet on no intents topic:
        /// librdkafka 2.0's idempotent producer retrying through the mock cluster's outage.
        /// Nothing a relay could answer: left out of `produced`, and counted apart.
        var notOnTopic = 0
        /// Per intent id, the statuses of its outcomes (with `original_status` for a duplicate).
        var outcomes: [String: [String]] = [:]
        var outcomeEvents = 0
        var faults: [Fault: Int] = [:]
        /// Sends APNs took in without answering (while it stalled): each may be sent again.
        var unanswered = 0
    }

    let stack: EmbeddedStack
    private let redis: RedisServerProcess
    private let relayBinary: String
    /// Each relay's configuration: the same but for its status port (two on one port: the
    /// second exits at start).
    private let configFiles: [String]
    let maxInFlight: Int
    /// `--devices` (0: a device per intent).
    let devices: Int
    /// With `--devices`: the urgent lane's topic.
    static let urgentTopic = "apns.intents.urgent"
    let processes: Locked<[ChildProcess?]>
    let seen = Locked(Seen())
    /// Relays not running when the load ended and the outcomes settled (one that could not start,
    /// or died): the soak then did not run the relays it names.
    let exited = Locked(0)

    init(stack: EmbeddedStack, relayBinary: String, relays: Int, maxInFlight: Int, devices: Int) throws {
        self.stack = stack
        self.relayBinary = relayBinary
        self.maxInFlight = maxInFlight
        self.devices = devices
        // Persistence as docs/redis.md asks for it: a restart loses nothing.
        redis = try RedisServerProcess(arguments: ["--appendonly", "yes", "--appendfsync", "always",
                                                   "--dir", stack.directory.path])
        var configuration = stack.configuration
        configuration.redis.url = redis.url
        configuration.limits.maxInFlight = maxInFlight
        configuration.shutdownDeadlineSeconds = 10
        configuration.retry.initialBackoffMilliseconds = 20
        configuration.retry.maxBackoffMilliseconds = 500
        if devices > 0 {
            try stack.cluster.createTopic(Self.urgentTopic, partitions: 8)
            configuration.kafka.lanes = [.init(topic: configuration.kafka.intentsTopic, weight: 1), .init(topic: Self.urgentTopic, weight: 8)]
        }
        configuration.http.address = "127.0.0.1"
        configFiles = try (0..<relays).map { index in
            var own = configuration
            own.http.port = try LoopbackPort.free()
            let file = stack.directory.appendingPathComponent("relay-\(index).yaml").path
            try own.redactedYAML.write(toFile: file, atomically: true, encoding: .utf8)
            return file
        }
        processes = Locked(Array(repeating: nil, count: relays))
        do {
            for index in 0..<relays { try startRelay(index) }
        } catch {
            for process in processes.withLock({ $0.compactMap { $0 } }) {
                process.signal(SIGKILL)
                process.wait()
            }
            redis.stop()
            throw error
        }
    }

    private func startRelay(_ index: Int) throws {
        let log = stack.directory.appendingPathComponent("relay-\(index).log").path
        let descriptor = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw SoakError(description: "cannot open \(log): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        let process = try ChildProcess(executable: relayBinary, arguments: ["run", "--config", configFiles[index]],
                                       standardOutput: descriptor, standardError: descriptor)
        processes.withLock { $0[index] = process }
    }

    /// SIGTERM to every relay; one still running 30 s later is killed. False when one was.
    /// `keepingLogs`: the stack's directory (the relays' logs, their configuration) stays.
    func stop(keepingLogs: Bool = false) async -> Bool {
        let running = processes.withLock { $0.compactMap { $0 } }.filter(\.isRunning)
        for process in running { process.signal(SIGTERM) }
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline, running.contains(where: \.isRunning) {
            try? await Task.sleep(for: .milliseconds(100))
        }
        var stoppedInTime = true
        for process in running where process.isRunning {
            stoppedInTime = false
            process.signal(SIGKILL)
            process.wait()
        }
        redis.stop()
        await stack.stop(keepingFiles: keepingLogs)
        return stoppedInTime
    }

    func run(seconds: Int, rate: Int, faultEvery: Int) async -> Soak.Verdict {
        let started = ContinuousClock.now
        let loadEnds = started + .seconds(seconds)
        guard let reader = try? KafkaConsumer(bootstrapServers: stack.configuration.kafka.brokers,
                                              groupID: "soak-reader-\(UUID().uuidString.prefix(8))",
                                              topics: [stack.configuration.kafka.outcomesTopic],
                                              properties: ["session.timeout.ms": "6000", "heartbeat.interval.ms": "500"]) else {
            return Verdict(line: "soak: cannot make the outcome reader: FAIL", passed: false)
        }
        let reading = Task { await readOutcomes(reader) }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.produce(rate: rate, until: loadEnds) }
            group.addTask { await self.injectFaults(every: faultEvery, until: loadEnds) }
            group.addTask { await self.report(started: started, until: loadEnds) }
        }
        // The load is over: wait for every produced intent's outcome (a relay killed last may
        // have left work for its partitions' next owner), two minutes at most.
        let settleBy = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < settleBy, missing().count > 0 {
            try? await Task.sleep(for: .milliseconds(500))
        }
        // Outcomes published twice (a redelivery after a kill) come in the same time.
        try? await Task.sleep(for: .seconds(2))
        await reader.close()  // ends its events, and so the reading
        await reading.value
        let left = missing()
        let down = processes.withLock { $0.filter { !($0?.isRunning ?? false) }.count }
        exited.withLock { $0 = down }
        if !left.isEmpty {
            // Outcomes the reader did not hand over, or outcomes not on the topic at all: the
            // whole topic read again, plainly (no group), tells the two apart.
            if let reader = try? KafkaTopicReader(bootstrapServers: stack.configuration.kafka.brokers, topic: stack.configuration.kafka.outcomesTopic),
               let all = try? await reader.readToEnd(timeout: .seconds(60)) {
                let ids = Set(all.compactMap { message in
                    (try? JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any])?["id"] as? String
                })
                let onTopic = left.filter(ids.contains)
                Self.progress("of those, \(onTopic.count) are on the outcomes topic read again from its start (\(all.count) records)"
                              + (onTopic.isEmpty ? "" : ": the outcome reader skipped them, e.g. \(onTopic.sorted().prefix(5).joined(separator: ", "))"))
                await reader.close()
            }
            // And an intent whose produce was reported delivered but that no intents topic holds
            // is the soak's own producer's loss, not the relays'.
            var intentIDs = Set<String>()
            for topic in [stack.configuration.kafka.intentsTopic] + (devices > 0 ? [Self.urgentTopic] : []) {
                if let reader = try? KafkaTopicReader(bootstrapServers: stack.configuration.kafka.brokers, topic: topic),
                   let all = try? await reader.readToEnd(timeout: .seconds(60)) {
                    for message in all {
                        if let id = (try? JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any])?["id"] as? String { intentIDs.insert(id) }
                    }
                    await reader.close()
                }
            }
            let absent = left.filter { !intentIDs.contains($0) }
            Self.progress("of those, \(absent.count) are on no intents topic (their produce was reported delivered)"
                          + (absent.isEmpty ? "" : ", e.g. \(absent.sorted().prefix(5).joined(separator: ", "))"))
            // Only when the topics were read: an unreadable topic proves nothing.
            if !intentIDs.isEmpty {
                seen.withLock { seen in
                    for id in absent { seen.produced.remove(id) }
                    seen.notOnTopic += absent.count
                }
            }
            let named = seen.withLock { seen in left.sorted().prefix(10).map { "\($0) at \(seen.landed[$0] ?? "?")" } }
            Self.progress("no outcome for \(left.count) intents (partition/offset), e.g. \(named.joined(separator: ", "))")
        }
        return verdict(elapsed: ContinuousClock.now - started)
    }

    // MARK: Load

    private func produce(rate: Int, until end: ContinuousClock.Instant) async {
        guard let producer = try? KafkaProducer(bootstrapServers: stack.configuration.kafka.brokers) else {
            Terminal.error("cannot make the soak's producer")
            return
        }
        let bulkTopic = stack.configuration.kafka.intentsTopic
        var next = 0
        // With --devices: per device and lane, how many intents it was sent so far.
        var sequences: [String: Int] = [:]
        var tick = ContinuousClock.now
        await withDiscardingTaskGroup { sends in
            while ContinuousClock.now < end {
                // Ten batches a second; each send is acknowledged (or fails) on its own, so a
                // broker outage does not hold the pace.
                let batch = max(1, rate / 10)
                for _ in 0..<batch {
                    let index = next
                    next += 1
                    let id = "soak-\(index)"
                    let token = EmbeddedStack.token(0x50_0000 + (devices > 0 ? index % devices : index))
                    var topic = bulkTopic
                    let value: String
                    if devices > 0 {
                        // Every fifth intent of a device is urgent; the payload says which of
                        // its lane's intents it is, for the order check.
                        let urgent = (index / devices) % 5 == 4
                        if urgent { topic = Self.urgentTopic }
                        let lane = urgent ? "u" : "b"
                        let sequence = sequences["\(token) \(lane)", default: 0]
                        sequences["\(token) \(lane)"] = sequence + 1
                        value = #"{"id":"\#(id)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","badge":{"increment":1},"#
                            + #""payload":{"aps":{"alert":"soak \#(index)"},"soak":{"lane":"\#(lane)","seq":\#(sequence)}}}"#
                    } else {
                        value = #"{"id":"\#(id)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{"alert":"soak \#(index)"}}}"#
                    }
                    sends.addTask {
                        do {
                            let delivery = try await producer.send(topic: topic, key: Array(token.utf8), value: Array(value.utf8))
                            self.seen.withLock {
                                $0.produced.insert(id)
                                $0.landed[id] = "\(topic) \(delivery.partition)/\(delivery.offset)"
                            }
                        } catch {
                            self.seen.withLock { $0.produceFailures += 1 }
                        }
                    }
                }
                tick += .milliseconds(100)
                try? await Task.sleep(until: tick)
            }
        }
    }

    private func readOutcomes(_ consumer: KafkaConsumer) async {
        for await event in consumer.events {
            guard case .messages(let batch) = event else { continue }
            var read: [(String, String)] = []
            var coordinates: [(String, String)] = []
            for message in batch {
                guard let object = try? JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any],
                      let id = object["id"] as? String, let status = object["status"] as? String else {
                    read.append(("", "unreadable"))
                    continue
                }
                let original = object["original_status"] as? String
                read.append((id, original.map { "\(status)/\($0)" } ?? status))
                coordinates.append((id, "\(object["lane"] as? String ?? "?") \(object["partition"] as? Int ?? -1)/\(object["offset"] as? Int ?? -1)"))
            }
            seen.withLock { seen in
                seen.outcomeEvents += read.count
                for (id, status) in read { seen.outcomes[id, default: []].append(status) }
                for (id, named) in coordinates { seen.named[id, default: []].insert(named) }
            }
        }
    }

    // MARK: Faults

    private func injectFaults(every interval: Int, until end: ContinuousClock.Instant) async {
        var count = 0
        while true {
            let left = end - ContinuousClock.now
            guard left > .zero else { return }
            try? await Task.sleep(for: min(.seconds(interval), left))
            // A fault lasts up to 8 s; none starts that close to the end of the load.
            guard ContinuousClock.now + .seconds(8) < end else { return }
            let fault = Fault.allCases[count % Fault.allCases.count]
            let victim = count / Fault.allCases.count
            count += 1
            Self.progress(fault.rawValue)
            switch fault {
            case .killRelay:
                let relays = processes.withLock { $0.count }
                let index = victim % relays
                if let process = processes.withLock({ $0[index] }) {
                    process.signal(SIGKILL)
                    _ = await Task.detached { process.wait() }.value
                }
                do {
                    try startRelay(index)
                } catch {
                    Terminal.error("cannot start relay \(index) again: \(error)")
                }
            case .pauseRedis:
                redis.signal(SIGSTOP)
                try? await Task.sleep(for: .seconds(8))
                redis.signal(SIGCONT)
            case .restartRedis:
                redis.stop()
                do {
                    try redis.start()
                } catch {
                    Terminal.error("redis-server does not start again: \(error)")
                }
            case .stallAPNs:
                let before = stack.simulator.accepted.count
                stack.simulator.update { $0.blackHole = true }
                try? await Task.sleep(for: .seconds(5))
                stack.simulator.update { $0.blackHole = false }
                let stalled = stack.simulator.accepted.count - before
                seen.withLock { $0.unanswered += stalled }
            case .storm503:
                stack.simulator.update { $0.failNext = (count: 1_000, status: 503) }
                try? await Task.sleep(for: .seconds(5))
                stack.simulator.update { $0.failNext = (count: 0, status: 503) }
            case .brokerOutage:
                for key in [KafkaMockCluster.APIKey.produce, KafkaMockCluster.APIKey.fetch] {
                    stack.cluster.failRequests(apiKey: key, errorCode: KafkaErrorCode.notLeaderForPartition)
                }
                try? await Task.sleep(for: .seconds(8))
                for key in [KafkaMockCluster.APIKey.produce, KafkaMockCluster.APIKey.fetch] {
                    stack.cluster.restoreRequests(apiKey: key)
                }
            }
            seen.withLock { $0.faults[fault, default: 0] += 1 }
        }
    }

    private func report(started: ContinuousClock.Instant, until end: ContinuousClock.Instant) async {
        while ContinuousClock.now < end {
            try? await Task.sleep(for: min(.seconds(10), end - ContinuousClock.now))
            let (produced, answered) = seen.withLock { ($0.produced.count, $0.outcomes.count) }
            Self.progress("\(Int((ContinuousClock.now - started).totalSeconds)) s, \(produced) intents produced, \(answered) answered")
        }
    }

    /// A progress line on standard error.
    static func progress(_ text: String) {
        FileHandle.standardError.write(Data("soak: \(text)\n".utf8))
    }
}
