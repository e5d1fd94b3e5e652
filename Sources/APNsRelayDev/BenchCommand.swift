import Common
import APNs
import APNsSimulator
import ArgumentParser
import Crypto
import Foundation
import NIOCore
import NIOPosix
import Synchronization
import CommandLineSupport

struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench", abstract: "Benchmarks that print figures.", subcommands: [BenchAPNsCommand.self, BenchE2ECommand.self, BenchLanesCommand.self, BenchStackCommand.self])
}

/// `apns-relay bench apns`: pushes N notifications through the client and prints the rate and
/// latency percentiles. Without --endpoint it starts a simulator in this process.
struct BenchAPNsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns",
        abstract: "Send N notifications through the APNs client; prints notifications/s and p50/p99 latency.")

    @Option(help: "https://HOST:PORT of a running simulator (default: one started in this process).")
    var endpoint: String?

    @Flag(help: "Skip TLS certificate verification.")
    var insecure = false

    @OptionGroup var credentials: CredentialOptions

    @Option(help: "apns-topic.")
    var topic: String = "com.example.app"

    @Option(help: "Notifications to send.")
    var count: Int = 100_000

    @Option(help: "Notifications in flight at once (default: enough to fill every connection's 1000 streams).")
    var concurrency: Int = 2000

    @Option(help: "Connections in the client's pool (default: the pool's default, 2).")
    var connections: Int = 2

    @Option(help: "Distinct device tokens to spread the notifications over.")
    var devices: Int = 10_000

    @Flag(help: "Send from a task per notification in flight (the client's async send) instead of from each answer's callback (the way the relay sends).")
    var taskPerSend = false

    func validate() throws {
        if count < 1 || concurrency < 1 || connections < 1 || devices < 1 {
            throw ValidationError("--count, --concurrency, --connections and --devices must be at least 1")
        }
        if endpoint != nil, !credentials.isGiven {
            throw ValidationError("an external --endpoint needs --team-id/--key-id/--key-file or --cert-file")
        }
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        var simulator: APNsSimulator?
        let credential: APNsCredential
        let target: APNsEndpoint
        do {
            if let endpoint {
                target = try APNsEndpoint(parsing: endpoint)
                credential = try credentials.credential()
            } else {
                let key = P256.Signing.PrivateKey()
                let teamID = credentials.teamID ?? "TEAM123456"
                let keyID = credentials.keyID ?? "ABC123DEFG"
                var configuration = SimulatorConfiguration()
                configuration.signingKeys = [.init(teamID: teamID, keyID: keyID, publicKey: key.publicKey)]
                configuration.recordInMemory = false
                let started = try await APNsSimulator.start(configuration)
                simulator = started
                target = APNsEndpoint(host: "127.0.0.1", port: started.port)
                let signer = ProviderTokenSigner(teamID: teamID, keyID: keyID, key: key)
                credential = .token(try LocalProviderTokenSource(signer: signer))
            }
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(1)
        }

        var configuration = APNsClientConfiguration(endpoint: target, credential: credential)
        configuration.connections = connections
        configuration.insecureSkipVerify = insecure || simulator != nil
        configuration.maxQueuedNotifications = max(concurrency, 10_000)
        configuration.requestTimeout = .seconds(30)
        let client = try APNsClient(configuration: configuration)

        let payload = ByteBuffer(string: #"{"aps":{"alert":"benchmark"}}"#)
        let tokens = (0..<devices).map(EmbeddedStack.token)
        let topic = self.topic
        let notification: @Sendable (Int) -> APNsNotification = { index in
            APNsNotification(deviceToken: tokens[index % tokens.count], topic: topic, payload: payload)
        }

        // One send first: it opens the connections and lifts APNs' one-stream start.
        let warmUp = try await client.send(notification(0))
        guard warmUp.classification == .delivered else {
            Terminal.error("warm-up notification was not delivered: \(warmUp)")
            await client.shutdown()
            await simulator?.stop()
            throw ExitCode(1)
        }

        let next = SharedCounter()
        let failed = SharedCounter()
        let count = self.count
        // One slot per notification, written once by whichever sender took its index: the
        // benchmark's own bookkeeping stays out of the client's memory figure.
        let latencies = LatencyRecorder(capacity: count)
        let started = ContinuousClock.now
        if taskPerSend {
            try await withThrowingTaskGroup(of: Void.self) { group in
                let executors = client.taskExecutors
                for task in 0..<min(concurrency, count) {
                    // Each sender runs on one of the pool's event loops, next to its connection.
                    group.addTask(executorPreference: executors[task % executors.count]) {
                        while true {
                            let index = next.value.wrappingAdd(1, ordering: .relaxed).oldValue
                            if index >= count { break }
                            let sent = ContinuousClock.now
                            let result = try await client.send(notification(index))
                            latencies.record((ContinuousClock.now - sent).totalNanoseconds)
                            if result.classification != .delivered { failed.value.add(1, ordering: .relaxed) }
                        }
                    }
                }
                try await group.waitForAll()
            }
        } else {
            let sender = CallbackSender(client: client, count: count, notification: notification, latencies: latencies, failed: failed)
            let executors = client.taskExecutors
            for slot in 0..<min(concurrency, count) {
                // Each chain of sends starts on one of the pool's event loops, next to its connection.
                executors[slot % executors.count].eventLoop.execute { sender.sendNext() }
            }
            await sender.finished.wait()
        }
        let elapsed = ContinuousClock.now - started
        let rss = peakResidentMiB()
        await client.shutdown()
        await simulator?.stop()

        let seconds = elapsed.totalSeconds
        let milliseconds = latencies.percentiles(0.50, 0.99).map { Double($0) / 1e6 }
        let failures = failed.value.load(ordering: .relaxed)
        Terminal.line("sent: \(count) failed: \(failures) seconds: \(String(format: "%.3f", seconds)) connections: \(connections) concurrency: \(concurrency)")
        Terminal.line("peak_rss_mb: \(rss.map { String(format: "%.1f", $0) } ?? "unknown")")
        Terminal.line(String(format: "notifications/s: %.0f p50_ms: %.2f p99_ms: %.2f",
                             Double(count) / seconds, milliseconds[0], milliseconds[1]))
        if failures > 0 { throw ExitCode(1) }
    }
}

/// `bench apns` sending as the relay sends: no task per notification; each answer's callback
/// (on the event loop of the connection that answered) records it and sends the next, so as
/// many chains run as notifications are in flight.
final class CallbackSender: Sendable {
    let client: APNsClient
    let count: Int
    let notification: @Sendable (Int) -> APNsNotification
    let latencies: LatencyRecorder
    let failed: SharedCounter
    private let next = Atomic<Int>(0)
    private let answered = Atomic<Int>(0)
    /// Open once every notification was answered.
    let finished = AsyncLatch()

    init(client: APNsClient, count: Int, notification: @escaping @Sendable (Int) -> APNsNotification,
         latencies: LatencyRecorder, failed: SharedCounter) {
        self.client = client
        self.count = count
        self.notification = notification
        self.latencies = latencies
        self.failed = failed
    }

    func sendNext() {
        let index = next.wrappingAdd(1, ordering: .relaxed).oldValue
        guard index < count else { return }
        let sent = ContinuousClock.now
        client.send(notification(index)) { result in
            self.latencies.record((ContinuousClock.now - sent).totalNanoseconds)
            guard case .success(let answer) = result, answer.classification == .delivered else {
                self.failed.value.add(1, ordering: .relaxed)
                // A refusal may come on the caller's thread at once: the next send goes from a
                // connection's loop, not one stack frame deeper per refusal.
                let loops = self.client.taskExecutors
                return self.ended { loops[Int.random(in: 0..<loops.count)].eventLoop.execute { self.sendNext() } }
            }
            self.ended { self.sendNext() }
        }
    }

    private func ended(thenNext sendNext: () -> Void) {
        // Acquiring and releasing: the last answer sees every chain's latency slots written.
        if answered.wrappingAdd(1, ordering: .acquiringAndReleasing).newValue == count { finished.open() }
        sendNext()
    }
}

/// A counter the sending tasks share.
final class SharedCounter: Sendable {
    let value = Atomic<Int>(0)
}

/// A benchmark's latencies, one preallocated slot per measured item: each `record` takes its own
/// slot from an atomic counter (no lock, no growth on the measured path), and the slots are read
/// only after every writer finished. Values past the capacity are dropped.
/// `@unchecked Sendable`: each `record` writes only the slot the counter gave it, and
/// `percentiles` reads after the writers were joined (their task group, or the relay's run
/// returned).
final class LatencyRecorder: @unchecked Sendable {
    private let slots: UnsafeMutableBufferPointer<Int64>
    private let next = Atomic<Int>(0)

    init(capacity: Int) {
        slots = .allocate(capacity: capacity)
        slots.initialize(repeating: 0)
    }

    deinit { slots.deallocate() }

    func record(_ value: Int64) {
        let index = next.wrappingAdd(1, ordering: .relaxed).oldValue
        if index < slots.count { slots[index] = value }
    }

    /// The given percentiles (0...1) of what was recorded; 0 when nothing was.
    func percentiles(_ points: Double...) -> [Int64] {
        let recorded = min(next.load(ordering: .relaxed), slots.count)
        let sorted = slots.prefix(recorded).sorted()
        return points.map { point in
            sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * point))]
        }
    }
}
