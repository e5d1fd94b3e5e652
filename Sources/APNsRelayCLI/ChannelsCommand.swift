import APNs
import ArgumentParser
import CommandLineSupport
import Common
import Foundation
import Logging

/// `apns-relay channels create|list|get|delete`: broadcast channel management (iOS 18 Live
/// Activities) on Apple's management hosts, one JSON line per answer (per channel for `list`);
/// exit 0 when APNs answered with success, 1 otherwise.
struct ChannelsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channels",
        abstract: "Create, list, read and delete broadcast push channels (Live Activities).",
        discussion: """
            Requests go to api-manage-broadcast.push.apple.com:2196 (production) or \
            api-manage-broadcast.sandbox.push.apple.com:2195 (development), or to the \
            https://HOST:PORT given as --environment. Output: JSON lines; exit 0 when APNs \
            answered with success, 1 when it refused (the line carries its status and reason) \
            or did not answer.
            """,
        subcommands: [Create.self, List.self, Get.self, Delete.self])

    /// What every subcommand takes: where, with what credential, through what proxy.
    struct Connection: ParsableArguments {
        @Option(help: "production, development, or https://HOST:PORT (a management server).")
        var environment: String = "production"

        @Option(name: .customLong("bundle-id"), help: "The app's bundle id (no push-type suffix).")
        var bundleID: String

        @OptionGroup var credentials: CredentialOptions

        @Flag(help: "Skip TLS certificate verification (simulators only).")
        var insecure = false

        @Option(help: "HTTP proxy to tunnel through (CONNECT): http://[USER[:PASSWORD]@]HOST[:PORT]. Default: $APNS_RELAY_APNS_PROXY ($APNS_RELAY_APNS_NO_PROXY applies too).")
        var proxy: String?

        @Option(help: "Seconds to wait for the answer.")
        var timeout: Int = 10

        @OptionGroup var logging: LoggingOptions

        func validate() throws {
            if !credentials.isGiven { throw ValidationError("give --team-id/--key-id/--key-file or --cert-file") }
            if timeout < 1 { throw ValidationError("--timeout must be at least 1 second") }
            if bundleID.isEmpty || bundleID.contains("/") { throw ValidationError("--bundle-id must be a bundle id") }
        }

        /// The management endpoint: Apple's hosts by environment, or the one given.
        func endpoint() throws(APNsError) -> APNsEndpoint {
            switch environment {
            case "production": APNsEndpoint(host: "api-manage-broadcast.push.apple.com", port: 2196)
            case "development", "sandbox": APNsEndpoint(host: "api-manage-broadcast.sandbox.push.apple.com", port: 2195)
            default: try APNsEndpoint(parsing: environment)
            }
        }

        /// Sends one request; prints and returns APNs' answer (nil when none came: the error is
        /// printed instead).
        func request(_ method: String, _ path: String, headers: [(String, String)] = [], body: [UInt8]? = nil) async throws -> APNsClient.Answer? {
            try logging.bootstrap(defaultLevel: .critical)
            let configuration = try APNsClientConfiguration.forCommand(endpoint: try endpoint(), credential: try credentials.credential(),
                                                                       timeout: timeout, insecure: insecure, proxy: proxy)
            let client = try APNsClient(configuration: configuration, logger: Logger(label: "apns-relay.channels"))
            do {
                let answer = try await client.request(method: method, path: path, headers: headers, body: body)
                await client.shutdown(grace: .seconds(1))
                return answer
            } catch {
                await client.shutdown(grace: .zero)
                var output = JSONObjectWriter()
                output.add("status", "failed")
                output.add("error", "\(error)")
                Terminal.line(output.json)
                return nil
            }
        }

        var channelsPath: String { "/1/apps/\(bundleID)/channels" }
    }

    /// Prints a refusal (status, reason, request id) and exits 1; returns on success.
    static func expect(_ answer: APNsClient.Answer?, _ success: Int) throws -> APNsClient.Answer {
        guard let answer else { throw ExitCode(1) }
        guard answer.status == success else {
            var output = JSONObjectWriter()
            output.add("status", answer.status)
            output.addOrNull("reason", (try? JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: Any])?["reason"] as? String)
            output.addOrNull("request_id", answer[header: "apns-request-id"])
            Terminal.line(output.json)
            throw ExitCode(1)
        }
        return answer
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a channel; prints its id.")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("storage-policy"), help: "0: no message stored (only expiration 0 accepted), 1: the most recent stored for up to 8 h. It cannot change later.")
        var storagePolicy: Int

        func validate() throws {
            if ![0, 1].contains(storagePolicy) { throw ValidationError("--storage-policy must be 0 or 1") }
        }

        func run() async throws {
            let body = Array(#"{"message-storage-policy":\#(storagePolicy),"push-type":"LiveActivity"}"#.utf8)
            let answer = try ChannelsCommand.expect(try await connection.request("POST", connection.channelsPath, body: body), 201)
            var output = JSONObjectWriter()
            output.addOrNull("channel_id", answer[header: "apns-channel-id"])
            output.add("message_storage_policy", storagePolicy)
            output.addOrNull("request_id", answer[header: "apns-request-id"])
            Terminal.line(output.json)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the app's channels, one JSON line each.")
        @OptionGroup var connection: Connection

        func run() async throws {
            let answer = try ChannelsCommand.expect(try await connection.request("GET", "/1/apps/\(connection.bundleID)/all-channels"), 200)
            let ids = (try? JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: Any])?["channels"] as? [String] ?? []
            for id in ids {
                var output = JSONObjectWriter()
                output.add("channel_id", id)
                Terminal.line(output.json)
            }
        }
    }

    struct Get: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Read a channel's settings.")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("channel-id"), help: "The channel id APNs gave at creation (base64).")
        var channelID: String

        func run() async throws {
            let answer = try ChannelsCommand.expect(
                try await connection.request("GET", connection.channelsPath, headers: [("apns-channel-id", channelID)]), 200)
            let settings = (try? JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: Any]) ?? [:]
            var output = JSONObjectWriter()
            output.add("channel_id", channelID)
            output.addOrNull("message_storage_policy", settings["message-storage-policy"] as? Int)
            output.addOrNull("push_type", settings["push-type"] as? String)
            Terminal.line(output.json)
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a channel (for good).")
        @OptionGroup var connection: Connection
        @Option(name: .customLong("channel-id"), help: "The channel id APNs gave at creation (base64).")
        var channelID: String

        func run() async throws {
            _ = try ChannelsCommand.expect(
                try await connection.request("DELETE", connection.channelsPath, headers: [("apns-channel-id", channelID)]), 204)
            var output = JSONObjectWriter()
            output.add("channel_id", channelID)
            output.add("status", "deleted")
            Terminal.line(output.json)
        }
    }
}
