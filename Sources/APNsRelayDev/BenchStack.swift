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

/// What `bench e2e` relays.
struct BenchWorkload: ParsableArguments {
    @Option(help: "Intents to relay.")
    var count: Int = 100_000

    @Option(help: "Partitions of the intents and outcomes topics.")
    var partitions: Int = 8

    @Option(help: "Distinct device tokens.")
    var devices: Int = 20_000

    @Flag(help: "Per-device policy on (the defaults: dedupe, rate limit burst 10, coalescing): a private redis-server. With the default workload no device reaches its limit.")
    var policy = false

    @Flag(name: .customLong("redis-cluster"), help: "With --policy: a Redis Cluster of three masters (redis.mode cluster) instead of one redis-server.")
    var redisCluster = false

    @Option(help: "Offer the intents at this many per second while the relay runs (latency below saturation), instead of producing them all before it starts.")
    var rate: Int?

    @Flag(help: "Every intent carries a sampled traceparent, and the relay exports its spans (tracing.otlp_endpoint) to a collector in the stack's process that takes them all.")
    var trace = false

    /// `bench lanes`: urgent intents offered on a lane of their own (weight 8, the workload's
    /// topic weight 1) at `urgentRate` from the parent's go.
    @Option(help: .hidden)
    var urgent = 0

    @Option(name: .customLong("urgent-rate"), help: .hidden)
    var urgentRate = 250

    static let urgentTopic = "apns.intents.urgent"
    static let urgentPrefix = "urgent-"

    func validate() throws {
        if count < 1 || partitions < 1 || devices < 1 { throw ValidationError("--count, --partitions and --devices must be at least 1") }
        if let rate, rate < 1 { throw ValidationError("--rate must be at least 1") }
        if redisCluster && !policy { throw ValidationError("--redis-cluster needs --policy") }
        if urgent < 0 || urgentRate < 1 { throw ValidationError("--urgent must be at least 0 and --urgent-rate at least 1") }
        if urgent > 0 && rate != nil { throw ValidationError("--urgent offers its own rate: not with --rate") }
        let retained = trace ? Self.tracedRetainedPerPartition : Self.retainedPerPartition
        if rate == nil, count > partitions * retained {
            throw ValidationError("""
                librdkafka's mock cluster keeps 5 MB per partition, about \(retained) of these intents: the oldest of \
                \(count) produced before the relay starts would be dropped unread, and their outcomes waited for \
                forever. Use --partitions \((count + retained - 1) / retained) or more, or --rate.
                """)
        }
    }

    /// The workload's intents a partition of the mock cluster holds for sure (it drops a
    /// partition's oldest records past 5 MB: about 21,400 of these; with `--trace`, whose
    /// `traceparent` header adds about 70 bytes to each, about 16,600).
    static let retainedPerPartition = 20_000
    static let tracedRetainedPerPartition = 15_000

    var arguments: [String] {
        ["--count", "\(count)", "--partitions", "\(partitions)", "--devices", "\(devices)"]
            + (policy ? ["--policy"] : []) + (redisCluster ? ["--redis-cluster"] : []) + (rate.map { ["--rate", "\($0)"] } ?? [])
            + (trace ? ["--trace"] : []) + (urgent > 0 ? ["--urgent", "\(urgent)", "--urgent-rate", "\(urgentRate)"] : [])
    }

    /// With `--rate`, intents produced before the relay starts (as many as partitions), whose
    /// outcomes say it consumes: the workload is offered from then on, so the group's join is
    /// not part of any latency.
    var warmUp: Int { rate == nil ? 0 : partitions }
    static let warmUpPrefix = "warm-up-"

    /// The workload's intent number `index` (a warm-up intent's, with `warmUp`); with `--trace`,
    /// the `traceparent` of a sampled trace of its own.
    func intent(_ index: Int, warmUp: Bool = false, urgent: Bool = false) -> (key: [UInt8], value: [UInt8], headers: [KafkaHeader]) {
        let token = EmbeddedStack.token(index % devices)
        let id = warmUp ? "\(Self.warmUpPrefix)\(index)" : urgent ? "\(Self.urgentPrefix)\(index)" : "bench-\(index)"
        let value = #"{"id":"\#(id)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{"alert":"benchmark \#(index)"}}}"#
        guard trace else { return (Array(token.utf8), Array(value.utf8), []) }
        let traceID = String(format: "%016llx%016llx", UInt64(warmUp ? 1 : 2), UInt64(index + 1))
        let parent = "00-\(traceID)-\(String(format: "%016llx", UInt64(index + 1)))-01"
        return (Array(token.utf8), Array(value.utf8), [KafkaHeader(name: "traceparent", value: Array(parent.utf8))])
    }
}

/// `apns-relay bench e2e-stack` (not listed in help): the mock Kafka cluster and the simulator
/// for `bench e2e`, with the workload produced into the intents topic. Prints
/// `ready CONFIG_FILE` once everything is produced, then serves until standard input closes.
/// With `--rate`, only the warm-up is produced before `ready`; the workload is offered at that
/// rate from the line `go` on standard input.
struct BenchStackCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "e2e-stack", shouldDisplay: false)

    @OptionGroup var workload: BenchWorkload

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let stack = try await EmbeddedStack.start(partitions: workload.partitions)
        let file = stack.directory.appendingPathComponent("apns-relay.yaml").path
        var redis: RedisServerProcess?
        var redisCluster: RedisClusterProcess?
        var collector: SpanSink?
        do {
            // With --rate only the warm-up goes in now; the workload follows the parent's go.
            if workload.rate == nil {
                try await produce(into: stack.configuration, count: workload.count)
            } else {
                try await produce(into: stack.configuration, count: workload.warmUp, warmUp: true)
            }
            var configuration = stack.configuration
            if workload.urgent > 0 {
                try stack.cluster.createTopic(BenchWorkload.urgentTopic, partitions: workload.partitions)
                configuration.kafka.lanes = [.init(topic: BenchWorkload.urgentTopic, weight: 8),
                                             .init(topic: configuration.kafka.intentsTopic, weight: 1)]
            }
            if workload.urgent > 0 || workload.rate != nil {
                // librdkafka's mock broker holds a Fetch whose answer is empty for all of its
                // MaxWait (fetch.wait.max.ms, 500 ms by default; rdkafka_mock_handlers.c), where a
                // broker answers as soon as fetch.min.bytes arrived: intents offered at a rate (a
                // trickle of urgent ones, or --rate) would come in the lumps those holds gather,
                // and measure them.
                configuration.kafka.consumerProperties["fetch.wait.max.ms"] = "10"
            }
            if workload.policy && workload.redisCluster {
                let cluster = try RedisClusterProcess(masters: 3)
                redisCluster = cluster
                configuration.redis.url = cluster.url
                configuration.redis.mode = .cluster
            } else if workload.policy {
                let server = try RedisServerProcess()
                redis = server
                configuration.redis.url = server.url
            }
            if workload.trace {
                let sink = try await SpanSink.start()
                collector = sink
                configuration.tracing.otlpEndpoint = sink.url
            }
            try configuration.redactedYAML.write(toFile: file, atomically: true, encoding: .utf8)
        } catch {
            Terminal.error("cannot prepare the benchmark: \(error)")
            await stack.stop()
            throw ExitCode(1)
        }
        Terminal.line("ready \(file)")
        if workload.rate != nil || workload.urgent > 0 {
            // Offer the workload (or the urgent intents) once the parent says go; serve until it
            // closes our input.
            let said = await Task.detached { readLine(from: STDIN_FILENO) }.value
            if said == "go" {
                do {
                    if let rate = workload.rate {
                        try await produce(into: stack.configuration, count: workload.count, rate: rate)
                    } else {
                        try await produce(into: stack.configuration, count: workload.urgent, rate: workload.urgentRate, urgent: true)
                    }
                } catch {
                    Terminal.error("cannot offer the workload: \(error)")
                }
            }
        }
        // Serve until the parent closes our standard input (or dies).
        await Task.detached { _ = FileHandle.standardInput.readDataToEndOfFile() }.value
        redis?.stop()
        redisCluster?.stop()
        await collector?.stop()
        await stack.stop()
    }

    /// Produces `count` intents of the workload (the warm-up's when `warmUp`, the urgent lane's
    /// when `urgent`), at `rate` intents/s when given, else as fast as the broker takes them.
    private func produce(into configuration: RelayConfiguration, count total: Int, warmUp: Bool = false,
                         rate: Int? = nil, urgent: Bool = false) async throws {
        let producer = try KafkaProducer(bootstrapServers: configuration.kafka.brokers)
        let topic = urgent ? BenchWorkload.urgentTopic : configuration.kafka.intentsTopic
        let started = ContinuousClock.now
        // At most 5,000 awaiting their delivery report at once.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<total {
                if index >= 5000 { try await group.next() }
                // At a rate: intent i is due i/rate seconds after the first.
                if let rate, index % max(1, rate / 1000) == 0 {
                    let due = started + .nanoseconds(Int64(index) * 1_000_000_000 / Int64(rate))
                    if due > .now { try await Task.sleep(until: due) }
                }
                let intent = workload.intent(index, warmUp: warmUp, urgent: urgent)
                group.addTask {
                    _ = try await producer.send(topic: topic, key: intent.key, value: intent.value, headers: intent.headers)
                }
            }
            try await group.waitForAll()
        }
        await producer.close()
    }
}

/// One line read from a file descriptor byte by byte (nothing past it is consumed), without its
/// newline; what came before EOF if there is none.
func readLine(from descriptor: Int32) -> String {
    var line: [UInt8] = []
    var byte: UInt8 = 0
    while read(descriptor, &byte, 1) == 1, byte != 0x0A { line.append(byte) }
    return String(decoding: line, as: UTF8.self)
}

/// The `bench e2e-stack` child process.
struct StackProcess {
    let process: ChildProcess
    /// The write end of its standard input: closing it stops the child.
    let input: Int32
    /// The read end of its standard output (kept open while it runs, read no further).
    let output: Int32
    let configurationFile: String

    static func start(_ workload: BenchWorkload) throws -> StackProcess {
        let input = try ChildProcess.makePipe(), output = try ChildProcess.makePipe()
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let process = try ChildProcess(executable: executable, arguments: ["bench", "e2e-stack"] + workload.arguments,
                                       standardInput: input.read, standardOutput: output.write)
        close(input.read)
        close(output.write)
        // Its first line says where the configuration is; EOF first means it failed (its stderr
        // is ours, so it has said why).
        let text = readLine(from: output.read)
        guard text.hasPrefix("ready ") else {
            process.signal(SIGTERM)
            process.wait()
            close(input.write)
            close(output.read)
            Terminal.error("the benchmark's Kafka and APNs stack did not start")
            throw ExitCode(1)
        }
        return StackProcess(process: process, input: input.write, output: output.read, configurationFile: String(text.dropFirst(6)))
    }

    /// The relay configuration it wrote (pointing at its cluster and simulator).
    func relayConfiguration() throws -> RelayConfiguration {
        do {
            return try RelayConfiguration.load(file: configurationFile, environment: [:])
        } catch {
            Terminal.error("the stack's configuration does not load: \(error)")
            throw ExitCode(1)
        }
    }

    /// Tells it to offer the workload (`--rate`, or the urgent lane's intents).
    func go() {
        let line: [UInt8] = Array("go\n".utf8)
        _ = line.withUnsafeBytes { write(input, $0.baseAddress, $0.count) }
    }

    /// Closes its standard input and waits for it to exit.
    func stop() {
        close(input)
        process.wait()
        close(output)
    }
}
