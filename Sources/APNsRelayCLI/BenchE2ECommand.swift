import APNs
import ArgumentParser
import Foundation
import Kafka
import Logging
import Relay

/// `apns-relay bench e2e`: N intents through Kafka (mock cluster), the relay and the simulator.
struct BenchE2ECommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "e2e",
        abstract: "Produce N intents into the mock cluster, relay them to the simulator; prints intents/s, latency and peak RSS.")

    @Option(help: "Intents to relay.")
    var count: Int = 100_000

    @Option(help: "Partitions of the intents and outcomes topics.")
    var partitions: Int = 8

    @Option(help: "Distinct device tokens.")
    var devices: Int = 20_000

    func validate() throws {
        if count < 1 || partitions < 1 || devices < 1 { throw ValidationError("--count, --partitions and --devices must be at least 1") }
    }

    func run() async throws {
        Terminal.logErrorsOnly()
        let stack = try await EmbeddedStack.start(partitions: partitions)
        // The Kafka clients must be gone before the mock cluster is.
        let figures = try await measure(stack.configuration)
        await stack.stop()
        Terminal.line("outcomes: " + figures.counts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
        Terminal.line(figures.line)
        if figures.counts["delivered"] != count { throw ExitCode(1) }
    }

    private func measure(_ configuration: RelayConfiguration) async throws -> (counts: [String: Int], line: String) {
        let producer = try KafkaProducer(bootstrapServers: configuration.kafka.brokers)
        let topic = configuration.kafka.intentsTopic
        // Produce everything first, at most 5,000 awaiting their delivery report at once.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<count {
                if index >= 5000 { try await group.next() }
                let token = EmbeddedStack.token(index % devices)
                let value = #"{"id":"bench-\#(index)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{"alert":"benchmark \#(index)"}}}"#
                group.addTask { _ = try await producer.send(topic: topic, key: Array(token.utf8), value: Array(value.utf8)) }
            }
            try await group.waitForAll()
        }

        let pipeline = try RelayPipeline(configuration: configuration, worker: "bench")
        let running = Task { await pipeline.run() }
        let deadline = ContinuousClock.now + .seconds(600)
        var finishedAt = ContinuousClock.now
        while ContinuousClock.now < deadline {
            if pipeline.outcomeCounts.values.reduce(0, +) >= count {
                finishedAt = .now
                break
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        let rss = peakResidentMiB()
        let counts = pipeline.outcomeCounts
        let started = pipeline.firstConsumedAt ?? finishedAt
        pipeline.requestStop()
        await running.value

        // Latencies from the outcome events (consume to APNs' answer), read after the clock stopped.
        let reader = try KafkaConsumer(bootstrapServers: configuration.kafka.brokers, groupID: "bench-reader",
                                       topics: [configuration.kafka.outcomesTopic], properties: configuration.kafka.properties)
        var latencies: [Int] = []
        latencies.reserveCapacity(count)
        for await event in reader.events {
            guard case .messages(let batch) = event else { continue }
            for message in batch {
                if let object = try? JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any],
                   let latency = object["latency_ms"] as? Int {
                    latencies.append(latency)
                }
            }
            if latencies.count >= count || ContinuousClock.now > deadline { break }
        }
        await reader.close()
        await producer.close()

        let elapsed = finishedAt - started
        let seconds = elapsed.totalSeconds
        latencies.sort()
        func percentile(_ p: Double) -> Int { latencies.isEmpty ? 0 : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] }
        return (counts, String(format: "intents/s: %.0f p50_ms: %d p99_ms: %d peak_rss_mb: %.1f",
                               Double(count) / max(seconds, 0.001), percentile(0.5), percentile(0.99), rss ?? 0))
    }
}
