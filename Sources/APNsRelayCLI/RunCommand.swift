import ArgumentParser
import Logging
import Metrics
import Prometheus
import Relay
import ServiceLifecycle

/// `apns-relay run --config FILE`: the relay's main job until SIGTERM or SIGINT.
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Consume intents from Kafka, deliver them to APNs, publish one outcome per intent.",
        discussion: """
            SIGTERM or SIGINT: stop consuming, finish in-flight intents within \
            shutdown_deadline_seconds, flush the outcomes, commit, exit 0. Environment variables \
            APNS_RELAY_<KEY> override scalar keys (see docs/configuration.md).
            """)

    @Option(help: "YAML configuration file.")
    var config: String

    func run() async throws {
        let configuration: RelayConfiguration
        do {
            configuration = try RelayConfiguration.load(file: config)
        } catch {
            Terminal.error("invalid configuration \(config):\n\(error)")
            throw ExitCode(2)
        }
        let logger = Logger(label: "apns-relay")
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        let pipeline: RelayPipeline
        do {
            pipeline = try RelayPipeline(configuration: configuration, logger: logger)
        } catch {
            Terminal.error("cannot start: \(error)")
            throw ExitCode(1)
        }
        for warning in pipeline.warnings { logger.warning("\(warning)") }
        let status: StatusServer
        do {
            status = try await StatusServer.start(port: configuration.http.port, registry: registry, status: pipeline)
        } catch {
            Terminal.error("cannot serve http.port \(configuration.http.port): \(error)")
            throw ExitCode(1)
        }
        logger.info("serving /metrics, /healthz, /readyz", metadata: ["http.port": "\(status.port)"])
        let group = ServiceGroup(configuration: .init(
            services: [PipelineService(pipeline: pipeline)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
        await status.stop()
    }
}

/// Runs the pipeline; graceful shutdown asks it to drain.
struct PipelineService: Service {
    let pipeline: RelayPipeline

    func run() async throws {
        let pipeline = self.pipeline
        await withGracefulShutdownHandler {
            await pipeline.run()
        } onGracefulShutdown: {
            pipeline.requestStop()
        }
    }
}

/// `apns-relay check-config FILE`: validates and prints the effective configuration.
struct CheckConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Validate a configuration file and print the effective configuration, secrets redacted.")

    @Argument(help: "YAML configuration file.")
    var file: String

    func run() throws {
        do {
            let configuration = try RelayConfiguration.load(file: file)
            Terminal.line(configuration.redactedYAML)
        } catch {
            Terminal.error("invalid configuration \(file):\n\(error)")
            throw ExitCode(2)
        }
    }
}
