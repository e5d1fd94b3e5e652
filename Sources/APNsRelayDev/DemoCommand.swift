import Common
import APNs
import ArgumentParser
import Foundation
import Kafka
import Logging
import Redis
import Relay
import Synchronization
import RedisTesting
import CommandLineSupport

/// `apns-relay demo`: the relay's main job on embedded defaults, in one process.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run the relay against an in-process Kafka mock cluster and APNs simulator with a mixed stream of intents.")

    @Option(help: "Normal intents to send (spread over --devices devices).")
    var count: Int = 5000

    @Option(help: "Distinct device tokens for the normal intents (keep count/devices at most the rate limit's burst, 10, or some come out coalesced).")
    var devices: Int = 1000

    @Option(name: .customLong("failure-rate"), help: "Fraction of APNs answers that are 500/503 (retried by the relay).")
    var failureRate: Double = 0.02

    @Flag(help: "Run without Redis (no dedupe, tokens minted in this process).")
    var noRedis = false

    /// Intents published a second time: they come out `duplicate`.
    static let republished = 50
    /// Intents with `"badge": {"increment": 1}` for one device, all at once: a burst past the
    /// rate limit's (burst 10, then one per 5 s).
    static let badgeIncrements = 20

    /// The highest badge count an outcome reported.
    final class BadgeSeen: Sendable {
        let value = Atomic<Int64>(0)
    }

    func validate() throws {
        if count < 1 || devices < 1 { throw ValidationError("--count and --devices must be at least 1") }
        if !(0...0.5).contains(failureRate) { throw ValidationError("--failure-rate must be between 0 and 0.5") }
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let unregistered = EmbeddedStack.token(0xdead_beef)
        let failureRate = self.failureRate
        Terminal.line("starting: Kafka mock cluster (3 brokers), APNs simulator\(noRedis ? "" : ", redis-server"), relay")
        let stack = try await EmbeddedStack.start { simulator in
            simulator.behaviour.unregistered = [unregistered: 1_432_819_882_000]
            simulator.behaviour.failureRate = failureRate
        }
        var configuration = stack.configuration
        var redis: RedisServerProcess?
        if !noRedis {
            do {
                let server = try RedisServerProcess()
                redis = server
                configuration.redis.url = server.url
            } catch {
                Terminal.error("\(error) (or run with --no-redis)")
                await stack.stop()
                throw ExitCode(1)
            }
        }
        Terminal.line("kafka: \(configuration.kafka.brokers)  apns: \(configuration.apns.endpoint)"
                      + (redis.map { "  redis: \($0.url)" } ?? ""))
        // The relay's Kafka clients must be gone before the mock cluster is.
        let badgeSeen = BadgeSeen()
        let counts = try await relay(configuration, unregistered: unregistered, badgeSeen: badgeSeen)
        let answers = stack.simulator.answers
        redis?.stop()
        await stack.stop()

        Terminal.line("")
        Terminal.line("outcome       count")
        for status in Outcome.Status.allCases {
            Terminal.line(status.rawValue.padding(toLength: 13, withPad: " ", startingAt: 0) + " " + String(counts[status.rawValue] ?? 0))
        }
        if !noRedis {
            Terminal.line("")
            let limit = configuration.policy.defaults.rateLimit
            Terminal.line("rate limit per device: burst \(limit.burst), then \(limit.refillPerSecond)/s; the burst of \(Self.badgeIncrements) at one device: "
                          + "\(limit.burst) sent at once, \(counts["coalesced"] ?? 0) coalesced, the newest sent when the bucket refilled")
            Terminal.line("badge count after \(Self.badgeIncrements) increments for one device: \(badgeSeen.value.load(ordering: .relaxed)) (kept in Redis)")
        }
        Terminal.line("")
        Terminal.line("APNs simulator answers: " + answers.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", "))
    }

    /// Produces the stream, runs the relay until every intent has its outcome; returns the
    /// outcome counts.
    private func relay(_ configuration: RelayConfiguration, unregistered: String, badgeSeen: BadgeSeen) async throws -> [String: Int] {
        // The highest badge count among the outcomes (the badge increments arrive in order).
        let badge = badgeSeen
        let application = try RelayApplication(configuration: configuration, worker: "demo", published: { outcome in
            if let count = outcome.badge { badge.value.max(count, ordering: .relaxed) }
        })
        let pipeline = application.pipeline
        let running = Task { await application.run() }

        let producer = try KafkaProducer(bootstrapServers: configuration.kafka.brokers)
        var intents = Self.mixedStream(count: count, devices: devices, unregistered: unregistered)
        intents.shuffle()
        if !noRedis {
            // Some intents published twice: one copy is delivered, the other comes out duplicate.
            intents += intents.prefix(Self.republished).filter { $0.1.hasPrefix(#"{"id":"demo-"#) }
            // A burst of badge increments for one device: the first ones go out at once, the rest
            // are coalesced into the newest, which waits in the device's mailbox until the
            // bucket refills; the relay counts every increment in Redis.
            let badged = EmbeddedStack.token(0xbad9e)
            for index in 0..<Self.badgeIncrements {
                intents.append((badged, #"{"id":"badge-\#(index)","token":"\#(badged)","topic":"\#(EmbeddedStack.topic)","badge":{"increment":1},"payload":{"aps":{"alert":"New message"}}}"#))
            }
        }
        let total = intents.count
        Terminal.line("producing \(total) intents: \(count) normal, plus unregistered, expired, no-credentials and invalid ones"
                      + (noRedis ? "" : ", some published twice, and \(Self.badgeIncrements) badge increments for one device"))
        let topic = configuration.kafka.intentsTopic
        _ = try await producer.send(topic: topic, records: intents.map { (key, value) in (key.map { Array($0.utf8) }, Array(value.utf8)) })

        let started = ContinuousClock.now
        var last = 0
        while true {
            try await Task.sleep(for: .milliseconds(500))
            let counts = pipeline.outcomeCounts
            let done = counts.values.reduce(0, +)
            let seconds = (ContinuousClock.now - started).totalSeconds
            let rate = Double(done - last) * 2
            last = done
            Terminal.line(String(format: "%6.1fs  %6d/%d outcomes  %7.0f intents/s  ", seconds, done, total, rate)
                          + counts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
            if done >= total || seconds > 120 { break }
        }
        pipeline.requestStop()
        await running.value
        await producer.close()
        return pipeline.outcomeCounts
    }

    /// (key, value) pairs: normal alerts, one unregistered device, intents already expired,
    /// a topic without credentials, and messages that are not usable intents.
    static func mixedStream(count: Int, devices: Int, unregistered: String) -> [(String?, String)] {
        var intents: [(String?, String)] = []
        for index in 0..<count {
            let token = EmbeddedStack.token(index % devices)
            intents.append((token, #"{"id":"demo-\#(index)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{"alert":"Hello \#(index)"}}}"#))
        }
        for index in 0..<5 {
            intents.append((unregistered, #"{"id":"gone-\#(index)","token":"\#(unregistered)","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{"alert":"x"}}}"#))
            let token = EmbeddedStack.token(100_000 + index)
            intents.append((token, #"{"id":"late-\#(index)","token":"\#(token)","topic":"\#(EmbeddedStack.topic)","expiration":1,"payload":{"aps":{"alert":"x"}}}"#))
            intents.append((token, #"{"id":"nocred-\#(index)","token":"\#(token)","topic":"com.unknown.app","payload":{"aps":{"alert":"x"}}}"#))
        }
        intents.append(("garbage", "this is not JSON"))
        intents.append((nil, #"{"token":"abc","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{}}}"#))
        intents.append(("xyz", #"{"id":"bad-token","token":"xyz","topic":"\#(EmbeddedStack.topic)","payload":{"aps":{}}}"#))
        return intents
    }
}
