import Common
import APNs
import ArgumentParser
import Foundation
import Logging
import Relay
import NIOCore
import CommandLineSupport

/// `apns-relay send`: one push, one JSON line with the answer; exit 0 only when delivered.
struct SendCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Send one push notification and print APNs' answer as JSON.")

    @Option(help: "production, development, or https://HOST:PORT.")
    var endpoint: String

    @Flag(help: "Skip TLS certificate verification (simulators only).")
    var insecure = false

    @Option(help: "HTTP proxy to tunnel through (CONNECT): http://[USER[:PASSWORD]@]HOST[:PORT]. Default: $APNS_RELAY_APNS_PROXY (which keeps a password out of the process list; $APNS_RELAY_APNS_NO_PROXY applies too).")
    var proxy: String?

    @OptionGroup var credentials: CredentialOptions

    @Option(help: "apns-topic: the bundle id plus the push type's suffix.")
    var topic: String

    @Option(help: "Device token, hex.")
    var token: String

    @Option(help: "Alert text; sends {\"aps\":{\"alert\":TEXT}}.")
    var alert: String?

    @Option(help: "File with the whole JSON payload.")
    var payload: String?

    @Option(name: .customLong("push-type"), help: "apns-push-type; the topic needs the type's suffix (voip: .voip, ...).")
    var pushType: PushType = .alert

    @Option(help: "apns-priority: 10, 5 or 1 (default: 5 for background, else 10).")
    var priority: Int?

    @Option(help: "apns-expiration, epoch seconds (0: now or never).")
    var expiration: Int64?

    @Option(name: .customLong("collapse-id"), help: "apns-collapse-id.")
    var collapseID: String?

    @Option(help: "Seconds to wait for the answer.")
    var timeout: Int = 10

    func validate() throws {
        if (alert == nil) == (payload == nil) { throw ValidationError("give exactly one of --alert and --payload") }
        if !credentials.isGiven { throw ValidationError("give --team-id/--key-id/--key-file or --cert-file") }
        if timeout < 1 { throw ValidationError("--timeout must be at least 1 second") }
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .critical)
        var output = JSONObjectWriter()
        let succeeded: Bool
        do {
            succeeded = try await send(into: &output)
        } catch let error as APNsError {
            if case .invalidNotification(let invalid) = error {
                output.add("status", "rejected")
                output.add("reason", invalid.code.rawValue)
                output.add("error", invalid.message)
            } else {
                output.add("status", "failed")
                output.add("error", error.description)
                Terminal.error(error.description)
            }
            succeeded = false
        }
        Terminal.line(output.json)
        if !succeeded { throw ExitCode(1) }
    }

    private func send(into output: inout JSONObjectWriter) async throws -> Bool {
        let body: ByteBuffer
        if let alert {
            body = APNsNotification.alert(alert, deviceToken: token, topic: topic).payload
        } else {
            guard let data = FileManager.default.contents(atPath: payload!) else {
                throw APNsError.credential("cannot read payload file \(payload!)")
            }
            body = ByteBuffer(bytes: data)
        }
        let notification = APNsNotification(deviceToken: token, topic: topic, pushType: pushType, priority: priority,
                                            expiration: expiration, collapseID: collapseID, payload: body)
        // Validate before touching credentials or the network: an invalid push sends nothing.
        do {
            try notification.validate()
        } catch {
            throw APNsError.invalidNotification(error)
        }
        let configuration = try APNsClientConfiguration.forCommand(endpoint: try APNsEndpoint(parsing: endpoint),
                                                                   credential: try credentials.credential(), timeout: timeout,
                                                                   insecure: insecure, proxy: proxy)
        // The answer (or the error) is the output; the client's own logs would only repeat it
        // (so the command logs at critical unless --log-level says otherwise).
        let logger = Logger(label: "apns-relay.send")
        let client = try APNsClient(configuration: configuration, logger: logger)
        let result: APNsResult
        do {
            result = try await client.send(notification)
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()

        switch result.classification {
        case .delivered: output.add("status", "delivered")
        case .rejected: output.add("status", "rejected")
        case .unregistered: output.add("status", "unregistered")
        case .retryable, .credentialFault: output.add("status", "failed")
        }
        output.addIfPresent("http_status", result.status)
        output.addIfPresent("reason", result.reason?.description)
        output.add("apns_id", result.apnsID)
        output.addIfPresent("timestamp", result.timestamp)
        if let failure = result.failure {
            output.add("error", failure.description)
            Terminal.error(failure.description)
        }
        return result.classification == .delivered
    }
}
