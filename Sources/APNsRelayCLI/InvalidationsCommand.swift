import ArgumentParser
import Foundation
import Kafka
import Relay
import CommandLineSupport

/// `apns-relay invalidations --config FILE [--since DURATION]`: the (topic, token) pairs the
/// invalidations topic holds as dead now, one JSON line each. Read-only: no consumer group.
struct InvalidationsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "invalidations",
        abstract: "Print the (topic, token) pairs currently known dead, as JSON lines (read-only).",
        discussion: """
            Reads kafka.invalidations_topic of --config to its end (no consumer group joins, \
            nothing is committed) and prints the last record of every key that no tombstone \
            followed: one JSON object per line, as the relay published it. Exit 0 when the read \
            finished, 1 when Kafka failed or the read passed --timeout, 2 for a bad configuration.
            """)

    @Option(help: "YAML configuration file (kafka.brokers, kafka.config, kafka.invalidations_topic).")
    var config: String

    @Option(help: "Only pairs whose record the relay published within this long before now (its \"at\"; e.g. 90s, 30m, 24h, 7d).")
    var since: AgeLimit?

    @Option(help: "Give up reading after this long (e.g. 60s, 5m).")
    var timeout = AgeLimit(seconds: 60)

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let configuration = try loadConfiguration(config)
        let topic = configuration.kafka.invalidationsTopic
        guard !topic.isEmpty else {
            Terminal.error("\(config): kafka.invalidations_topic is empty, so the relay publishes no invalidations")
            throw ExitCode(2)
        }
        let state: InvalidationTopic
        do {
            state = try await InvalidationTopic.read(bootstrapServers: configuration.kafka.brokers, topic: topic,
                                                     properties: configuration.kafka.consumerSettings,
                                                     timeout: .seconds(timeout.seconds))
        } catch {
            Terminal.error("cannot read \(topic): \(error)")
            throw ExitCode(1)
        }
        let cutoff = since.map { Int64(Date().timeIntervalSince1970 * 1000) - $0.seconds * 1000 }
        for record in state.records(since: cutoff) {
            Terminal.line(String(decoding: record, as: UTF8.self))
        }
    }
}

/// The relays' configuration file for a command that reads it: a file that does not load is
/// named on standard error, and the command exits 2.
func loadConfiguration(_ path: String) throws -> RelayConfiguration {
    do {
        return try RelayConfiguration.load(file: path)
    } catch {
        Terminal.error("\(error)")
        throw ExitCode(2)
    }
}

/// A length of time on the command line: a whole number and a unit, `s`, `m`, `h` or `d`.
struct AgeLimit: ExpressibleByArgument {
    var seconds: Int64

    init(seconds: Int64) {
        self.seconds = seconds
    }

    init?(argument: String) {
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        guard let unit = argument.last.flatMap({ units[$0] }), let number = Int64(argument.dropLast()), number > 0,
              number <= Int64.max / unit / 1000 else { return nil }
        seconds = number * unit
    }

    static var defaultCompletionKind: CompletionKind { .default }
}
