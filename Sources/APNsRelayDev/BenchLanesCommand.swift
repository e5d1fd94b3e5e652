import ArgumentParser
import CommandLineSupport
import Foundation
import Logging
import Relay
import Common

/// `apns-relay-dev bench lanes`: priority lanes under a bulk backlog. A bulk backlog is on the
/// workload's intents topic (weight 1) before the relay starts; once a tenth of it is answered,
/// urgent intents (lane `apns.intents.urgent`, weight 8) are offered at a steady rate. Prints the
/// urgent intents' consume → outcome latency and the bulk lane's rate before and while they flow.
/// The stack (mock cluster, simulator) runs in a child process, as for `bench e2e`.
struct BenchLanesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lanes",
        abstract: "A bulk backlog, then urgent intents at a steady rate on a lane of their own; prints urgent p50/p99 latency and the bulk rate meanwhile.")

    @Option(help: "Bulk intents backlogged before the relay starts.")
    var bulk = 200_000

    @Option(help: "Urgent intents offered while the backlog drains.")
    var urgent = 1000

    @Option(name: .customLong("urgent-rate"), help: "Urgent intents per second.")
    var urgentRate = 250

    /// 16: the mock cluster keeps 5 MB of log per partition and trims older records past it,
    /// about 21,000 of these intents; 200,000 on 8 partitions would lose some before they are read.
    @Option(help: "Partitions of each intents topic and of the outcomes topic (the mock cluster keeps about 20,000 intents per partition).")
    var partitions = 16

    @Option(help: "Distinct device tokens (urgent and bulk intents share them).")
    var devices = 20_000

    @Option(name: .customLong("max-in-flight"),
            help: "The relay's limits.max_in_flight (default: the relay's default). The lanes' weights order admissions only while it binds (docs/lanes.md, Measured).")
    var maxInFlight: Int?

    @OptionGroup var logging: LoggingOptions

    func validate() throws {
        if bulk < 10 || urgent < 1 || urgentRate < 1 || partitions < 1 || devices < 1 || (maxInFlight ?? 1) < 1 {
            throw ValidationError("--bulk must be at least 10, --urgent, --urgent-rate, --partitions, --devices and --max-in-flight at least 1")
        }
        if bulk / partitions > 20_000 {
            throw ValidationError("--bulk \(bulk) on \(partitions) partitions: the mock cluster keeps about 20,000 intents per partition and trims older ones; use more partitions")
        }
    }

    /// What the relay answered so far, by lane.
    private struct Progress {
        var bulk = 0
        var urgent = 0
        var notDelivered = 0
        /// Bulk outcomes when the urgent intents were offered, and when their last one came.
        var bulkAtGo = 0
        var goAt: ContinuousClock.Instant?
        var urgentEndedAt: ContinuousClock.Instant?
        var bulkAtUrgentEnd = 0
    }

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        signal(SIGPIPE, SIG_IGN)
        let workload = try BenchWorkload.parse(["--count", "\(bulk)", "--partitions", "\(partitions)", "--devices", "\(devices)",
                                                "--urgent", "\(urgent)", "--urgent-rate", "\(urgentRate)"])
        let stack = try StackProcess.start(workload)
        defer { stack.stop() }
        var configuration = try stack.relayConfiguration()
        if let maxInFlight { configuration.limits.maxInFlight = maxInFlight }
        let latencies = LatencyRecorder(capacity: urgent)
        let progress = Locked(Progress())
        let urgentCount = urgent
        let application = try RelayApplication(configuration: configuration, worker: "bench", published: { outcome in
            progress.withLock { progress in
                if outcome.status != .delivered { progress.notDelivered += 1 }
                if outcome.lane == BenchWorkload.urgentTopic {
                    latencies.record(outcome.latencyMilliseconds)
                    progress.urgent += 1
                    if progress.urgent == urgentCount {
                        progress.urgentEndedAt = .now
                        progress.bulkAtUrgentEnd = progress.bulk
                    }
                } else {
                    progress.bulk += 1
                }
            }
        })
        let pipeline = application.pipeline
        let running = Task { await application.run() }
        let deadline = ContinuousClock.now + .seconds(600)
        var lastReport = ContinuousClock.now
        while ContinuousClock.now < deadline {
            let now = progress.withLock { $0 }
            if now.goAt == nil, now.bulk >= bulk / 10 {
                progress.withLock {
                    $0.goAt = .now
                    $0.bulkAtGo = $0.bulk
                }
                stack.go()
            }
            if now.bulk >= bulk && now.urgent >= urgent { break }
            if ContinuousClock.now - lastReport >= .seconds(5) {
                lastReport = .now
                FileHandle.standardError.write(Data("bench: bulk \(now.bulk) of \(bulk), urgent \(now.urgent) of \(urgent), \(pipeline.inFlight) in flight\n".utf8))
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        let started = pipeline.firstConsumedAt
        pipeline.requestStop()
        await running.value

        let final = progress.withLock { $0 }
        guard let started, let goAt = final.goAt, let endedAt = final.urgentEndedAt, final.bulk >= bulk else {
            Terminal.error("the benchmark did not finish within 600 s: bulk \(final.bulk) of \(bulk), urgent \(final.urgent) of \(urgent)")
            throw ExitCode(1)
        }
        let before = Double(final.bulkAtGo) / max((goAt - started).totalSeconds, 0.001)
        let duringCount = final.bulkAtUrgentEnd - final.bulkAtGo
        let during = Double(duringCount) / max((endedAt - goAt).totalSeconds, 0.001)
        let share = Double(duringCount) / Double(max(duringCount + urgent, 1))
        let milliseconds = latencies.percentiles(0.5, 0.99)
        Terminal.line(String(format: "urgent p50_ms: %lld p99_ms: %lld bulk_per_s_before: %.0f bulk_per_s_during: %.0f bulk_share_during: %.2f",
                             milliseconds[0], milliseconds[1], before, during, share))
        if final.notDelivered > 0 {
            Terminal.error("\(final.notDelivered) outcomes were not delivered")
            throw ExitCode(1)
        }
    }
}
