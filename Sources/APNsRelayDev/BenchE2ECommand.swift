import Common
import APNs
import ArgumentParser
import Foundation
import Kafka
import Logging
import Redis
import Relay
import Spawn
import RedisTesting
import CommandLineSupport

/// `apns-relay bench e2e`: N intents through Kafka (mock cluster), the relay and the simulator.
///
/// The mock cluster and the simulator run in a child process (`bench e2e-stack`), as a broker
/// and APNs would in production, so the peak RSS printed is the relay's own; the three still
/// share the machine's cores. The child produces every intent before the relay starts.
struct BenchE2ECommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "e2e",
        abstract: "Produce N intents into the mock cluster, relay them to the simulator; prints intents/s, latency and the relay's peak RSS.")

    @OptionGroup var workload: BenchWorkload

    @Flag(help: "Run each intent in a task of its own, where the relay drives intents without Redis or tracing by callbacks (docs/performance.md).")
    var taskPerIntent = false

    @Flag(help: "Run the relay as an operator does: `apns-relay run` (next to this executable) as a process of its own, its CPU and peak RSS read from /proc, its outcomes from the outcomes topic.")
    var process = false

    @OptionGroup var logging: LoggingOptions

    /// Outcomes a partition of the mock cluster holds for sure (it drops a partition's oldest
    /// records past 5 MB: about 7,500 of the workload's outcomes).
    static let outcomesRetainedPerPartition = 7_000

    func validate() throws {
        if taskPerIntent && (workload.policy || workload.trace) {
            throw ValidationError("intents with Redis or tracing run in a task each already: --task-per-intent is not for --policy or --trace")
        }
        if taskPerIntent && process { throw ValidationError("--task-per-intent measures inside this process: not with --process") }
        // Read back from the outcomes topic, which the mock cluster also keeps 5 MB of per
        // partition: a reader behind by more would wait for outcomes dropped unread.
        if process, workload.count > workload.partitions * Self.outcomesRetainedPerPartition {
            let needed = (workload.count + Self.outcomesRetainedPerPartition - 1) / Self.outcomesRetainedPerPartition
            throw ValidationError("""
                with --process the outcomes are read back from the mock cluster, which keeps 5 MB per partition (about \
                7,000 outcomes): use --partitions \(needed) or more for \(workload.count) intents
                """)
        }
    }

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        // A child that died is seen when reading from it, not as a signal when writing to it.
        signal(SIGPIPE, SIG_IGN)
        let stack = try StackProcess.start(workload)
        defer { stack.stop() }
        let configuration = try stack.relayConfiguration()
        let redisBefore = await RedisCPU.read(configuration.redis)
        var figures = try await process ? measureProcess(configuration, stack: stack) : measure(configuration, stack: stack)
        if let before = redisBefore, let after = await RedisCPU.read(configuration.redis) {
            // The relay's start and stop included, as in its own CPU figure.
            for line in before.lines(until: after, intents: workload.count + workload.warmUp) { Terminal.line(line) }
        }
        figures.counts["delivered", default: 0] -= workload.warmUp
        Terminal.line("outcomes: " + figures.counts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
        Terminal.line(figures.line)
        if figures.counts["delivered"] != workload.count { throw ExitCode(1) }
    }

    private func measure(_ configuration: RelayConfiguration, stack: StackProcess) async throws -> (counts: [String: Int], line: String) {
        let count = workload.count
        // Latencies (consume to outcome) as the relay publishes its outcomes; the warm-up
        // intents' are left out.
        let latencies = LatencyRecorder(capacity: count)
        let cpuBefore = ProcessCPU.now()
        let allocationsBefore = ProcessAllocations.now()
        let application = try RelayApplication(configuration: configuration, worker: "bench", published: { outcome in
            if outcome.id?.hasPrefix(BenchWorkload.warmUpPrefix) != true { latencies.record(outcome.latencyMilliseconds) }
        }, deliveryByCallbacks: !taskPerIntent, countsShardTurns: true)
        let pipeline = application.pipeline
        let running = Task { await application.run() }
        var progress = BenchProgress(workload: workload, stack: stack)
        // The shards' state turns from the first consume on: the group's join is not the
        // intents' (the lag report's once a second, counted, are a few per run).
        var turnsBefore: (all: Int, hops: Int)?
        while !progress.finished(done: pipeline.outcomeCounts.values.reduce(0, +), detail: ", \(pipeline.inFlight) in flight") {
            if turnsBefore == nil, pipeline.firstConsumedAt != nil { turnsBefore = pipeline.shardTurns }
            try await Task.sleep(for: .milliseconds(5))
        }
        let cpu = ProcessCPU.now() - cpuBefore
        let allocations = ProcessAllocations.now().flatMap { after in allocationsBefore.map { after - $0 } }
        let rss = peakResidentMiB()
        let counts = pipeline.outcomeCounts
        let turnsNow = pipeline.shardTurns, turnsThen = turnsBefore ?? (0, 0)
        let turns = (all: turnsNow.all - turnsThen.all, hops: turnsNow.hops - turnsThen.hops)
        Terminal.line("driven by callbacks: \(pipeline.intentsDrivenByCallbacks) intents (the warm-up's included)")
        let started = progress.offeredAt ?? pipeline.firstConsumedAt ?? progress.finishedAt
        pipeline.requestStop()
        await running.value

        var line = figureLine(seconds: (progress.finishedAt - started).totalSeconds, latencies: latencies, peakResidentMiB: rss, cpuSeconds: cpu)
        // This process is the relay: its allocations from its start to its last outcome, as for
        // the CPU figure (the warm-up's intents counted too).
        if let allocations { line += String(format: " allocations_per_intent: %.1f", Double(allocations) / Double(count + workload.warmUp)) }
        // The shards' state, confined to their loops: its turns per intent, and the hops to a
        // shard's loop they took (the reader's, the mailbox poll's, per batch or poll).
        line += String(format: " shard_turns_per_intent: %.2f hops: %.3f", Double(turns.all) / Double(count + workload.warmUp),
                       Double(turns.hops) / Double(count + workload.warmUp))
        return (counts, line)
    }

    /// The relay as `apns-relay run` in a process of its own, with the configuration the stack
    /// wrote (its status port moved to a free one). Its outcomes are read from the outcomes
    /// topic; the figures are taken once the last arrived, before it is asked to stop: CPU
    /// (user + system) and peak RSS from its /proc entry, start-up included as in the
    /// in-process mode.
    private func measureProcess(_ configuration: RelayConfiguration, stack: StackProcess) async throws -> (counts: [String: Int], line: String) {
        let relayBinary = try siblingExecutable("apns-relay")
        var own = configuration
        own.http.address = "127.0.0.1"
        own.http.port = try LoopbackPort.free()
        let file = URL(fileURLWithPath: stack.configurationFile).deletingLastPathComponent().appendingPathComponent("apns-relay-process.yaml").path
        try own.redactedYAML.write(toFile: file, atomically: true, encoding: .utf8)
        let reader = try KafkaTopicReader(bootstrapServers: configuration.kafka.brokers, topic: configuration.kafka.outcomesTopic)
        let latencies = LatencyRecorder(capacity: workload.count)
        var counts: [String: Int] = [:]
        var done = 0
        // Epoch ms: the first intent consumed (an outcome's `at` less its `latency_ms`) and the
        // last outcome made, as the records say.
        var firstConsumed = Int64.max, lastAnswered = Int64.min
        // Its output is this process's standard error: what it says when it cannot start.
        let relay = try ChildProcess(executable: relayBinary, arguments: ["run", "--config", file],
                                     standardOutput: STDERR_FILENO, standardError: STDERR_FILENO)
        var progress = BenchProgress(workload: workload, stack: stack)
        while relay.isRunning, !progress.finished(done: done) {
            let batch = (try? await reader.read(timeout: .milliseconds(200)) { _, _ in true }) ?? []
            for message in batch {
                guard let outcome = BenchOutcome(message.value) else { continue }
                done += 1
                firstConsumed = min(firstConsumed, outcome.at - outcome.latencyMilliseconds)
                lastAnswered = max(lastAnswered, outcome.at)
                counts[outcome.status, default: 0] += 1
                if !outcome.id.hasPrefix(BenchWorkload.warmUpPrefix) { latencies.record(outcome.latencyMilliseconds) }
            }
        }
        let cpu = ProcessFigures.cpuSeconds(of: relay.pid)
        let rss = ProcessFigures.peakResidentMiB(of: relay.pid)
        let exitedEarly = !relay.isRunning
        relay.signal(SIGTERM)
        relay.wait()
        await reader.close()
        if exitedEarly { Terminal.error("apns-relay run exited before the benchmark ended") }
        // As the in-process mode: from the go with --rate, else from the first intent consumed
        // (the relay's start and group join left out), to the last outcome made.
        let from = progress.offeredAtMilliseconds ?? firstConsumed
        // No outcome read (the relay exited first): no time to quote.
        let seconds = done > 0 && lastAnswered >= from ? Double(lastAnswered - from) / 1000 : nil
        return (counts, figureLine(seconds: seconds, latencies: latencies, peakResidentMiB: rss, cpuSeconds: cpu ?? 0))
    }

    /// The figures line; `seconds` nil (no outcome read) gives no rate: `intents/s: n/a`.
    private func figureLine(seconds: Double?, latencies: LatencyRecorder, peakResidentMiB: Double?, cpuSeconds: Double) -> String {
        let milliseconds = latencies.percentiles(0.5, 0.99)
        let rate = seconds.map { String(format: "%.0f", Double(workload.count) / max($0, 0.001)) } ?? "n/a"
        return "intents/s: \(rate) " + String(format: "p50_ms: %lld p99_ms: %lld peak_rss_mb: %.1f cpu_us_per_intent: %.1f",
                                                milliseconds[0], milliseconds[1], peakResidentMiB ?? 0,
                                                cpuSeconds * 1_000_000 / Double(workload.count + workload.warmUp))
    }
}

/// The measuring loop's bookkeeping, the same whether the relay runs in this process or its own.
struct BenchProgress {
    let workload: BenchWorkload
    let stack: StackProcess
    let deadline = ContinuousClock.now + .seconds(600)
    /// With `--rate`, when the stack was told to offer the workload.
    var offeredAt: ContinuousClock.Instant?
    /// The same, in epoch ms (to set against outcome records).
    var offeredAtMilliseconds: Int64?
    var finishedAt = ContinuousClock.now
    var lastReport = ContinuousClock.now

    /// Takes the number of outcomes so far: once the warm-up is answered (`--rate`), the relay
    /// consumes every partition and the stack is told to offer the workload; every 5 s a progress
    /// line (with `detail`) goes to standard error. True once every outcome is in, or at the
    /// deadline (600 s).
    mutating func finished(done: Int, detail: String = "") -> Bool {
        if workload.rate != nil, offeredAt == nil, done >= workload.warmUp {
            offeredAt = .now
            offeredAtMilliseconds = APNsIdentifiers.epochMilliseconds()
            stack.go()
        }
        if done >= workload.count + workload.warmUp || ContinuousClock.now >= deadline {
            finishedAt = .now
            return true
        }
        if ContinuousClock.now - lastReport >= .seconds(5) {
            lastReport = .now
            FileHandle.standardError.write(Data("bench: \(done - workload.warmUp) of \(workload.count) outcomes\(detail)\n".utf8))
        }
        return false
    }
}

/// What `bench e2e --process` reads of an outcome record.
struct BenchOutcome {
    var id: String
    var status: String
    var latencyMilliseconds: Int64
    /// When it was made (epoch ms).
    var at: Int64

    init?(_ value: [UInt8]) {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(value))) as? [String: Any],
              let status = object["status"] as? String else { return nil }
        self.id = object["id"] as? String ?? ""
        self.status = status
        self.latencyMilliseconds = Int64(object["latency_ms"] as? Int ?? 0)
        self.at = Int64(object["at"] as? Int ?? 0)
    }
}
