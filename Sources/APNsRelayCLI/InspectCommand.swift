import ArgumentParser
import Foundation
import Redis
import Relay

/// `apns-relay inspect --token HEX --topic T`: what Redis holds for one device and app. Read-only.
struct InspectCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inspect",
        abstract: "Show what Redis holds for one device and app (read-only).",
        discussion: "Redis comes from --redis, or from redis.url of --config (environment overrides apply).")

    @Option(help: "Device token (hex).")
    var token: String

    @Option(help: "apns-topic (bundle id, with the push type's suffix if any).")
    var topic: String

    @Option(help: "YAML configuration file to take redis.url from.")
    var config: String?

    @Option(help: "redis://[[user]:password@]host[:port][/db] (instead of --config).")
    var redis: String?

    func validate() throws {
        if (config == nil) == (redis == nil) { throw ValidationError("give exactly one of --config and --redis") }
    }

    func run() async throws {
        Terminal.logErrorsOnly()
        let url: RedisURL
        do {
            if let redis {
                url = try RedisURL(parsing: redis)
            } else {
                let configuration = try RelayConfiguration.load(file: config ?? "")
                guard !configuration.redis.url.isEmpty else {
                    Terminal.error("\(config ?? ""): redis.url is empty, so the relay keeps nothing in Redis")
                    throw ExitCode(1)
                }
                url = try RedisURL(parsing: configuration.redis.url)
            }
        } catch let error as ExitCode {
            throw error
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(2)
        }
        let client = try RedisClient(configuration: RedisConfiguration(url: url))
        let read: Result<DeviceRecords, RedisError>
        do {
            read = .success(try await DeviceRecords.read(token: token, topic: topic, from: client))
        } catch {
            read = .failure(error)
        }
        await client.shutdown()
        let records: DeviceRecords
        switch read {
        case .success(let found):
            records = found
        case .failure(let error):
            Terminal.error("\(error) (\(url))")
            throw ExitCode(1)
        }
        Terminal.line("device \(token) app \(topic) in \(url)")
        if let json = records.lastSentJSON {
            Terminal.line("last sent: \(json) (kept \(records.lastSentSecondsToLive.map { "\($0) s more" } ?? "?"))")
        } else {
            Terminal.line("last sent: none recorded")
        }
        Terminal.line("badge: \(records.badge.map(String.init) ?? "none")")
        Terminal.line("parked: none (rate limits and store-and-forward are not part of this version)")
    }
}
