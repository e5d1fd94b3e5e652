import APNs
import ArgumentParser
import BuildInfo
import Foundation
import Logging
import Metrics
import Prometheus
import Relay
import ServiceLifecycle
import Common
import Synchronization
import CommandLineSupport

/// `apns-relay run --config FILE`: the relay's main job until SIGTERM or SIGINT.
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Consume intents from Kafka, deliver them to APNs, publish one outcome per intent.",
        discussion: """
            SIGTERM or SIGINT: stop consuming, finish in-flight intents within \
            shutdown_deadline_seconds, flush the outcomes, commit, exit 0. Environment variables \
            APNS_RELAY_<KEY> override scalar keys (see docs/configuration.md). The file and the \
            credentials' key files are watched: a valid change is applied by draining the \
            pipeline and starting it again with the new configuration; an invalid one is \
            reported and the running configuration stays.
            """)

    @Option(help: "YAML configuration file.")
    var config: String

    @Option(name: .customLong("reload-check-ms"), help: .hidden)
    var reloadCheckMilliseconds = 10_000

    @OptionGroup var logging: LoggingOptions

    /// Buckets of every duration histogram: swift-prometheus' (5 ms to 10 s), then on to an hour,
    /// so that an intent retried up to `retry.deadline_seconds` (600 s by default) or waiting in
    /// a mailbox, and an APNs request up to `apns.request_timeout_seconds` (at most 300 s), fall
    /// in a bucket of their own rather than all past the last one.
    static let durationBuckets: [Duration] = [
        .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
        .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30), .seconds(60),
        .seconds(120), .seconds(300), .seconds(600), .seconds(1800), .seconds(3600),
    ]

    func run() async throws {
        try logging.bootstrap(defaultLevel: .info)
        let (configuration, checked) = try loadUsableConfiguration(config, forCheck: false)
        // What the files held when they were loaded: a change from then on is a reload, even one
        // made before the relay is running (the status endpoints answer earlier).
        let loaded = PipelineService.fingerprint(config, configuration)
        let logger = Logger(label: "apns-relay")
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = Self.durationBuckets
        MetricsSystem.bootstrap(factory)
        Gauge(label: "apns_relay_build_info", dimensions: [("version", BuildInfo.version), ("commit", BuildInfo.commit)]).record(1)
        // Exported from the start, so the refused-reload alert has a series to compare with.
        for result in ["applied", "invalid"] { PipelineService.countReload(result, by: 0) }
        let application: RelayApplication
        do {
            application = try RelayApplication(configuration: configuration, credentials: checked.credentials, logger: logger)
        } catch {
            Terminal.fatal("cannot start: \(error)")
            throw ExitCode(1)
        }
        checked.log(logger)
        for warning in application.pipeline.warnings + unknownVariablesWarnings(configuration) { logger.warning("\(warning)") }
        let current = CurrentApplication(application)
        let status: StatusServer
        do {
            status = try await StatusServer.start(
                host: configuration.http.address, port: configuration.http.port, registry: registry, status: current,
                limits: StatusServer.Limits(requestTimeout: .seconds(configuration.http.requestTimeoutSeconds),
                                            maxConnections: configuration.http.maxConnections))
        } catch {
            Terminal.fatal("cannot serve http.port \(configuration.http.port) on \(configuration.http.address): \(error)")
            throw ExitCode(1)
        }
        logger.info("serving /metrics, /healthz, /readyz", metadata: [
            "http.address": "\(configuration.http.address)", "http.port": "\(status.port)",
        ])
        // Shut down in reverse order: the relay drains and commits first, the status endpoints
        // answer ("stopping") until it is done.
        let group = ServiceGroup(configuration: .init(
            services: [
                .init(service: StatusService(server: status, logger: logger)),
                // The relay stopping by itself (it refused its Redis, or could not start again
                // after a reload) closes the status endpoints gracefully; the exit code says why.
                .init(service: PipelineService(current: current, configFile: config, loaded: loaded, logger: logger,
                                               reloadInterval: .milliseconds(max(reloadCheckMilliseconds, 100))),
                      successTerminationBehavior: .gracefullyShutdownGroup),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
        if let refusal = current.application.pipeline.refusal {
            Terminal.fatal("stopped: \(refusal)")
            throw ExitCode(1)
        }
        if current.restartFailed.load(ordering: .relaxed) {
            Terminal.fatal("stopped: after a reload the relay could start with neither the new configuration nor the previous one (the log says why)")
            throw ExitCode(1)
        }
    }
}

/// The relay running now: the status endpoints follow it across reloads.
final class CurrentApplication: RelayStatus, Sendable {
    private let current: Locked<RelayApplication>
    /// A reload under way: the draining relay's pipeline, and when the next one was installed
    /// (nil while draining). Its drain ("stopping") and the next one's start ("starting", for
    /// at most ``reloadGrace``) are not a reason to be unready: a ConfigMap edit reaches every
    /// pod at once.
    private let reloading = Locked<(draining: ObjectIdentifier, installed: ContinuousClock.Instant?)?>(nil)
    /// How long a relay started by a reload may take to consume before it counts as unready.
    static let reloadGrace: Duration = .seconds(60)
    /// Set when a reload could start neither the new configuration nor the previous one.
    let restartFailed = Atomic<Bool>(false)

    init(_ application: RelayApplication) {
        current = Locked(application)
    }

    var application: RelayApplication {
        get { current.withLock { $0 } }
        set { current.withLock { $0 = newValue } }
    }

    var notAliveReason: String? { application.pipeline.notAliveReason }
    var notReadyReason: String? {
        let pipeline = application.pipeline
        guard let reload = reloading.withLock({ $0 }) else { return pipeline.notReadyReason }
        if let dead = pipeline.notAliveReason { return dead }
        // The old relay draining.
        if ObjectIdentifier(pipeline) == reload.draining { return nil }
        guard let reason = pipeline.notReadyReason else { return nil }
        // The next one starting, for a while.
        if let installed = reload.installed, ContinuousClock.now - installed < Self.reloadGrace { return nil }
        return reason
    }

    /// A reload drains `application`: it stays ready meanwhile.
    func reloadBegins(_ application: RelayApplication) {
        reloading.withLock { $0 = (ObjectIdentifier(application.pipeline), nil) }
    }

    /// The reload's next relay is installed: ready while it starts, up to ``reloadGrace``.
    func reloadInstalled() {
        reloading.withLock { if $0 != nil { $0?.installed = .now } }
    }

    /// A shutdown: "stopping" is reported from now on.
    func shutdownBegins() { reloading.withLock { $0 = nil } }
    var warnings: [String] { application.pipeline.warnings }
    var dependencyProblems: [String] { application.pipeline.dependencyProblems }
}

/// Runs the pipeline; graceful shutdown asks it to drain. While it runs, the configuration file
/// and the credentials' key files (a Kubernetes Secret update swaps a symlink: the files are
/// read through their paths) are checked every `reloadInterval`. A changed configuration that
/// loads, with every key file readable as a key, is applied: the pipeline drains (finished
/// intents committed, the rest consumed again) and a new one starts with it and with the keys
/// read when the change was checked (a key file swapped during the drain is checked as a change
/// of its own). A broken change is logged, once, and the running configuration stays in use.
struct PipelineService: Service {
    let current: CurrentApplication
    let configFile: String
    /// The files' fingerprint when the running configuration was loaded.
    let loaded: [UInt8]
    let logger: Logger
    /// How often the files are checked (10 s; tests go faster).
    let reloadInterval: Duration

    func run() async throws {
        let stopping = Atomic<Bool>(false)
        let current = self.current
        await withGracefulShutdownHandler {
            var fingerprint = loaded
            while true {
                let application = current.application
                let start = fingerprint
                let watching = Task { [self] in await watch(application, from: start) }
                await application.run()
                watching.cancel()
                guard let (next, credentials, seen) = await watching.value, !stopping.load(ordering: .relaxed) else { return }
                fingerprint = seen
                do {
                    // The keys validated with the change: a key file swapped during the drain
                    // is the next watch's change, checked like any other.
                    current.application = try RelayApplication(configuration: next, credentials: credentials, logger: logger)
                } catch {
                    // Validated, yet refused: the drained relay starts again as it was.
                    logger.error("cannot start with the new configuration; the running one stays", metadata: ["relay.error": "\(error)"])
                    Self.countReload("invalid")
                    do {
                        current.application = try RelayApplication(configuration: application.configuration,
                                                                   credentials: application.credentials, logger: logger)
                    } catch {
                        logger.critical("cannot start the relay again", metadata: ["relay.error": "\(error)"])
                        current.restartFailed.store(true, ordering: .relaxed)
                        current.shutdownBegins()
                        return
                    }
                }
                current.reloadInstalled()
                // A SIGTERM while the new one was being made stopped the old one only.
                if stopping.load(ordering: .relaxed) { current.application.requestStop() }
            }
        } onGracefulShutdown: {
            stopping.store(true, ordering: .relaxed)
            current.shutdownBegins()
            current.application.requestStop()
        }
    }

    /// Until cancelled: on a valid change, asks `pipeline` to stop and returns the new
    /// configuration, its keys as validated and its fingerprint.
    private func watch(_ application: RelayApplication, from start: [UInt8]) async -> (RelayConfiguration, [LoadedCredential], [UInt8])? {
        var last = start
        while !Task.isCancelled {
            try? await Task.sleep(for: reloadInterval)
            if Task.isCancelled { return nil }
            let configuration: RelayConfiguration
            do {
                configuration = try RelayConfiguration.load(file: configFile)
            } catch {
                let seen = Array((try? Data(contentsOf: URL(fileURLWithPath: configFile))) ?? Data())
                if seen != last {
                    last = seen
                    logger.error("the changed configuration is invalid; the running one stays", metadata: ["relay.error": "\(error)"])
                    Self.countReload("invalid")
                }
                continue
            }
            let seen = Self.fingerprint(configFile, configuration)
            guard seen != last else { continue }
            last = seen
            // The new relay starts with the keys this check read.
            let checked = RelayApplication.startProblems(configuration)
            guard checked.problems.isEmpty else {
                logger.error("the changed configuration or a file it names cannot be used; the running one stays",
                             metadata: ["relay.error": "\(checked.problems.joined(separator: "; "))"])
                Self.countReload("invalid")
                continue
            }
            checked.log(logger)
            if configuration.http.port != application.configuration.http.port {
                logger.warning("http.port changes only with a restart", metadata: ["http.port": "\(configuration.http.port)"])
            }
            logger.notice("configuration or credentials changed: draining and starting again with them", metadata: [
                "apns.credentials": "\(configuration.apns.credentials.map { "\($0.name) \($0.topics)" })",
            ])
            Self.countReload("applied")
            current.reloadBegins(application)
            application.requestStop()
            return (configuration, checked.credentials, seen)
        }
        return nil
    }

    /// `apns_relay_config_reloads_total{result="applied"|"invalid"}`.
    static func countReload(_ result: String, by count: Int64 = 1) {
        Counter(label: "apns_relay_config_reloads_total", dimensions: [("result", result)]).increment(by: count)
    }

    /// The configuration file's bytes and every credential file's (keys and certificates), read
    /// through their paths.
    static func fingerprint(_ file: String, _ configuration: RelayConfiguration) -> [UInt8] {
        var bytes = Array((try? Data(contentsOf: URL(fileURLWithPath: file))) ?? Data())
        for path in configuration.apns.credentials.flatMap(\.files) {
            bytes += Array(path.utf8) + [0]
            bytes += Array((try? Data(contentsOf: URL(fileURLWithPath: path))) ?? Data()) + [0]
        }
        return bytes
    }
}

/// `apns-relay check-config --config FILE`: validates the file, reads every file it names, and
/// prints the effective configuration.
struct CheckConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Validate a configuration and the files it names; print the effective configuration, secrets redacted.",
        discussion: """
            Exit 0: `run` would start with it (warnings, such as a certificate that expires within \
            30 days, go to standard error). Exit 2: a key is unknown or a value invalid, a key or \
            certificate file does not parse, a certificate expired, no credential is listed, or a \
            topic has none (every problem is listed on standard error).
            """)

    @Option(help: "YAML configuration file.")
    var config: String?

    @Argument(help: ArgumentHelp("The file, as an argument (the same as --config).", valueName: "file"))
    var file: String?

    @OptionGroup var logging: LoggingOptions

    func validate() throws {
        if (config == nil) == (file == nil) { throw ValidationError("give the file once: --config FILE (or FILE)") }
    }

    func run() throws {
        try logging.bootstrap(defaultLevel: .error)
        Terminal.line(try loadUsableConfiguration(config ?? file ?? "").0.redactedYAML)
    }
}

/// Loads the configuration at `path` and reads every file it names (``RelayConfiguration/preflightProblems``,
/// the Kafka and Redis client settings): on any problem, lists them all on standard error and
/// exits 2. Returns the configuration with what that check found: its warnings and unusable
/// certificates, and the credentials it read.
///
/// - Parameter forCheck: `check-config`: unusable certificates are problems too, warnings are
///   printed on standard error. Else (`run`) the caller logs both and goes on.
func loadUsableConfiguration(_ path: String, forCheck: Bool = true) throws -> (RelayConfiguration, PreflightResult) {
    let configuration: RelayConfiguration
    do {
        configuration = try RelayConfiguration.load(file: path)
    } catch {
        Terminal.fatal("invalid configuration \(path):\n\(error)")
        throw ExitCode(2)
    }
    let checked = RelayApplication.startProblems(configuration)
    let problems = checked.problems + (forCheck ? checked.unusable : [])
    guard problems.isEmpty else {
        Terminal.fatal("invalid configuration \(path):\n" + problems.map { "  \($0)" }.joined(separator: "\n"))
        throw ExitCode(2)
    }
    if forCheck {
        for warning in checked.warnings + unknownVariablesWarnings(configuration) { Terminal.error("warning: \(warning)") }
    }
    return (configuration, checked)
}

/// A warning for each `APNS_RELAY_` variable of the process that names nothing the relay reads
/// (``RelayConfiguration/unknownEnvironmentVariables(_:passphraseVariables:)``): its name, never its value.
func unknownVariablesWarnings(_ configuration: RelayConfiguration) -> [String] {
    let passphrases = Set(configuration.apns.credentials.compactMap { credential -> String? in
        if case .certificate(_, _, let variable) = credential.kind { return variable }
        return nil
    })
    return RelayConfiguration.unknownEnvironmentVariables(ProcessInfo.processInfo.environment, passphraseVariables: passphrases).map {
        "\($0) is set but names no configuration key or other setting of the relay (a misspelt name?); it is ignored"
    }
}
