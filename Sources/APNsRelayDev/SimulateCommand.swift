import APNs
import APNsSimulator
import ArgumentParser
import Dispatch
import Foundation
import NIOCore
import NIOSSL
import ServiceLifecycle
import Logging
import CommandLineSupport

/// `apns-relay simulate`: runs the APNs simulator until SIGINT or SIGTERM.
struct SimulateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Run an APNs look-alike server (TLS + HTTP/2) for tests, demos and benchmarks.",
        discussion: """
            The first line on stdout is `listening on https://HOST:PORT`. SIGUSR1 sends GOAWAY on every \
            connection. On exit a summary of answers by status and reason goes to stderr.
            """)

    @Option(help: "HOST:PORT to listen on; port 0 picks a free one.")
    var listen: String = "127.0.0.1:2197"

    @Option(name: .customLong("jwt-key"), help: "TEAM_ID:KEY_ID:KEY_FILE (the .p8 or its public key PEM); repeatable. Without any, no provider token is required.")
    var jwtKeys: [String] = []

    @Option(help: "File of device tokens answered 410 Unregistered, one per line (optionally followed by a millisecond timestamp).")
    var unregistered: String?

    @Option(name: .customLong("max-streams"), help: "MAX_CONCURRENT_STREAMS after the first valid request.")
    var maxStreams: UInt32 = 1000

    @Option(name: .customLong("rate-limit"), help: "Accept at most this many notifications per device per second; more get 429 TooManyRequests.")
    var rateLimit: Int?

    @Option(name: .customLong("failure-rate"), help: "Fraction (0 to 1) of good requests answered 500 or 503.")
    var failureRate: Double = 0

    @Option(name: .customLong("goaway-after"), help: "Send GOAWAY on a connection after this many streams.")
    var goAwayAfter: Int?

    @Option(name: .customLong("latency-ms"), help: "Delay every answer by this many milliseconds.")
    var latencyMilliseconds: Int64 = 0

    @Option(help: "Append every accepted notification as a JSON line to this file.")
    var record: String?

    @Option(name: .customLong("tls-cert"), help: "PEM certificate chain to serve (default: a self-signed one made at start-up).")
    var tlsCert: String?

    @Option(name: .customLong("tls-key"), help: "PEM private key for --tls-cert.")
    var tlsKey: String?

    @Option(name: .customLong("client-ca"), help: "Certificate auth: PEM file of the certificates client certificates must chain to (TLS then requires one); each request's topic must be one of the certificate's (its UID or topics extension).")
    var clientCA: String?

    @Option(help: "With --client-ca: the APNs environment this simulator is (any, production, development); a certificate for the other one only gets 403 BadCertificateEnvironment.")
    var environment: String = "any"

    @Option(name: .customLong("token-max-age"), help: "Provider tokens older than this many seconds get ExpiredProviderToken.")
    var tokenMaxAge: Int64 = 3600

    func validate() throws {
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        if !(0...1).contains(failureRate) { throw ValidationError("--failure-rate must be between 0 and 1") }
        if let rateLimit, rateLimit < 1 { throw ValidationError("--rate-limit must be at least 1") }
        if let goAwayAfter, goAwayAfter < 1 { throw ValidationError("--goaway-after must be at least 1") }
        if latencyMilliseconds < 0 { throw ValidationError("--latency-ms cannot be negative") }
        _ = try Self.parseListen(listen)
    }

    static func parseListen(_ text: String) throws -> (host: String, port: Int) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
              (0...65535).contains(port) else {
            throw ValidationError("--listen wants HOST:PORT, got '\(text)'")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .info)
        let configuration: SimulatorConfiguration
        do {
            configuration = try makeConfiguration()
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(1)
        }
        let simulator: APNsSimulator
        do {
            simulator = try await APNsSimulator.start(configuration)
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(1)
        }
        Terminal.line("listening on \(simulator.url)")

        signal(SIGUSR1, SIG_IGN)
        let goAwaySignal = DispatchSource.makeSignalSource(signal: SIGUSR1)
        goAwaySignal.setEventHandler { simulator.goAwayAll() }
        goAwaySignal.resume()

        let service = SimulatorService(simulator: simulator)
        let group = ServiceGroup(configuration: .init(
            services: [service], gracefulShutdownSignals: [.sigterm, .sigint],
            logger: Logger(label: "apns-relay.simulate")))
        try await group.run()
        goAwaySignal.cancel()
        let summary = simulator.answers.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }
        Terminal.error("answers: " + (summary.isEmpty ? "none" : summary.joined(separator: ", ")))
    }

    private func makeConfiguration() throws -> SimulatorConfiguration {
        var configuration = SimulatorConfiguration()
        (configuration.host, configuration.port) = try Self.parseListen(listen)
        configuration.signingKeys = try jwtKeys.map { try SimulatorConfiguration.SigningKey(parsing: $0) }
        configuration.maxConcurrentStreams = maxStreams
        configuration.recordInMemory = false
        configuration.recordFile = record
        configuration.tokenMaxAgeSeconds = tokenMaxAge
        configuration.behaviour.rateLimitPerDevice = rateLimit
        configuration.behaviour.failureRate = failureRate
        configuration.behaviour.goAwayAfterStreams = goAwayAfter
        configuration.behaviour.latency = .milliseconds(latencyMilliseconds)
        if let unregistered {
            guard let text = try? String(contentsOfFile: unregistered, encoding: .utf8) else {
                throw SimulatorError.configuration("cannot read --unregistered file \(unregistered)")
            }
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            for line in text.split(whereSeparator: \.isNewline) {
                let fields = line.split(separator: " ")
                guard let token = fields.first else { continue }
                configuration.behaviour.unregistered[String(token)] = fields.count > 1 ? Int64(fields[1]) ?? now : now
            }
        }
        guard let environment = SimulatorConfiguration.Environment(rawValue: environment) else {
            throw SimulatorError.configuration("--environment must be any, production or development")
        }
        configuration.environment = environment
        if let clientCA {
            do {
                configuration.clientCertificateTrustRoots = try NIOSSLCertificate.fromPEMFile(clientCA)
            } catch {
                throw SimulatorError.configuration("cannot use --client-ca \(clientCA): \(error)")
            }
        }
        if let tlsCert, let tlsKey {
            do {
                configuration.tlsIdentity = (try NIOSSLCertificate.fromPEMFile(tlsCert), try NIOSSLPrivateKey(file: tlsKey, format: .pem))
            } catch {
                throw SimulatorError.configuration("cannot use --tls-cert \(tlsCert) / --tls-key \(tlsKey): \(error)")
            }
        }
        return configuration
    }
}

/// Keeps the simulator up until graceful shutdown.
struct SimulatorService: Service {
    let simulator: APNsSimulator

    func run() async throws {
        try? await gracefulShutdown()
        await simulator.stop()
    }
}
