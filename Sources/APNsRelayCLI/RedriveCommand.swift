import ArgumentParser
import Foundation
import Relay
import CommandLineSupport

/// `apns-relay redrive --config FILE --since 2h [--status failed] [--reason-prefix RetryDeadline]
/// [--topic T] [--lane L] [--until 30m] [--dry-run]`: produces again the intents whose outcomes
/// the filter matches (``Redrive``).
struct RedriveCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "redrive",
        abstract: "Produce again the intents that came out failed or expired in a time range (after an incident).",
        discussion: """
            Reads kafka.outcomes_topic of --config from --since on (no consumer group joins), \
            picks the newest outcome of each intent the filter matches (failed ones by default), fetches the intent from \
            its lane by partition and offset and produces it again to that partition of its lane, with a \
            "redrive" field the relay copies into its outcomes and an apns-relay-redrive header. \
            Skipped, and counted: an intent a later outcome answered (or, with redis.url, whose \
            dedupe record says so); one a later delivery with the same collapse_id superseded, \
            or a newer selected one with the same collapse_id; an expired or now-or-never one; \
            one the lane no longer holds; one that no longer reads as an intent; and, with \
            redis.url, one a redrive produced already (so a second run sends nothing twice). \
            Prints one JSON line per intent on standard output, progress and a summary on \
            standard error. Exit 0 when every selected intent was re-driven or skipped, 1 when \
            Kafka or Redis failed (what was produced stays marked: run it again), 2 for a bad \
            configuration or arguments. --dry-run decides and prints, and changes nothing.
            """)

    @Option(help: "YAML configuration file of the relays (kafka.*, redis.*, defaults.expiration_seconds).")
    var config: String

    @Option(help: "Outcomes decided within this long before now (e.g. 90m, 2h, 1d).")
    var since: AgeLimit

    @Option(help: "...and at least this long before now (default: up to now).")
    var until: AgeLimit?

    @Option(name: .customLong("status"), help: "An outcome status to re-drive: failed, invalid, or expired (only counted: past their expiration) (repeatable; default: failed).")
    var statuses: [String] = []

    @Option(help: "Only outcomes whose reason starts so (e.g. RetryDeadline, CredentialFault).")
    var reasonPrefix: String?

    @Option(name: .customLong("topic"), help: "Only this app's (apns topic) intents (repeatable).")
    var topics: [String] = []

    @Option(name: .customLong("lane"), help: "Only this intents topic's intents (repeatable).")
    var lanes: [String] = []

    @Flag(help: "Decide and print what would be done; produce and mark nothing.")
    var dryRun = false

    @Flag(help: "Read the outcomes topic from its start, not from --since by the broker's time index (outcomes are filtered by their \"at\" either way).")
    var fromStart = false

    @Option(help: "Give up a Kafka read after this long (e.g. 60s, 5m).")
    var timeout = AgeLimit(seconds: 300)

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let configuration = try loadConfiguration(config)
        // The statuses no dedupe record holds: the others were answered, and a relay answers
        // them again `duplicate`.
        let redrivable: Set<String> = ["failed", "expired", "invalid"]
        if let unknown = statuses.first(where: { !redrivable.contains($0) }) {
            Terminal.error("--status \(unknown): one of \(redrivable.sorted().joined(separator: ", ")) (the others were answered, and come out duplicate)")
            throw ExitCode(2)
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var filter = RedriveFilter(since: now - since.seconds * 1000)
        filter.until = until.map { now - $0.seconds * 1000 }
        if let until, until.seconds >= since.seconds {
            Terminal.error("--until \(until.seconds) s ago is not after --since \(since.seconds) s ago: the range is empty")
            throw ExitCode(2)
        }
        if !statuses.isEmpty { filter.statuses = Set(statuses) }
        filter.reasonPrefix = reasonPrefix
        filter.topics = Set(topics)
        filter.lanes = Set(lanes)
        if let unknown = filter.lanes.first(where: { !configuration.kafka.intentTopics.contains($0) }) {
            Terminal.error("--lane \(unknown): not a lane of \(config) (\(configuration.kafka.intentTopics.joined(separator: ", ")))")
            throw ExitCode(2)
        }
        var redrive = Redrive(configuration: configuration, filter: filter)
        redrive.dryRun = dryRun
        redrive.seeksByTime = !fromStart
        redrive.timeout = .seconds(timeout.seconds)
        if configuration.redis.url.isEmpty {
            Terminal.error("no redis.url: dedupe records and redrive marks are not checked; run it again only once the relays answered this run's intents")
        }
        let report: Redrive.Report
        do {
            report = try await redrive.run(now: now, progress: { Terminal.error($0) }, decided: { Terminal.line($0.json(dryRun: dryRun)) })
        } catch {
            Terminal.error("redrive stopped: \(error)")
            throw ExitCode(1)
        }
        Terminal.error(report.summary(dryRun: dryRun))
    }
}
