public import ArgumentParser
import APNs
import Foundation
import Redis
import Relay
import CommandLineSupport

/// `apns-relay inspect --token HEX --topic T`: what Redis holds for one device and app. Read-only.
struct InspectCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inspect",
        abstract: "Show what Redis holds for one device and app (read-only).",
        discussion: "Redis comes from --redis, or from redis.url of --config (environment overrides apply); the keys' prefix from --key-prefix, or from redis.key_prefix of --config.")

    @Option(help: "Device token (hex).")
    var token: String

    @Option(help: "apns-topic (bundle id, with the push type's suffix if any).")
    var topic: String

    @Option(help: "YAML configuration file to take redis.url from.")
    var config: String?

    @Option(help: "redis://[[user]:password@]host[:port][/db] (instead of --config).")
    var redis: String?

    @Option(name: .customLong("redis-mode"), help: "With --redis: standalone, or cluster (--redis names a seed node).")
    var redisMode = RedisConfiguration.Mode.standalone

    @Option(name: .customLong("key-prefix"), help: "With --redis: the relay's redis.key_prefix.")
    var keyPrefix = "apns-relay:"

    func validate() throws {
        if (config == nil) == (redis == nil) { throw ValidationError("give exactly one of --config and --redis") }
        if !RelayConfiguration.RedisSettings.isValidKeyPrefix(keyPrefix) {
            throw ValidationError("--key-prefix: 1-64 characters of letters, digits and _ . : / -")
        }
    }

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try logging.bootstrap(defaultLevel: .error)
        let url: RedisURL
        var mode = redisMode
        var seeds: [RedisNodeAddress] = []
        var prefix = keyPrefix
        // The rules the bucket is read with: the file's, or the defaults.
        var policy = RelayConfiguration.Policy()
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
                mode = configuration.redis.mode
                seeds = configuration.redis.clusterSeeds
                prefix = configuration.redis.keyPrefix
                policy = configuration.policy
            }
        } catch let error as ExitCode {
            throw error
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(2)
        }
        var settings = RedisConfiguration(url: url)
        settings.mode = mode
        settings.clusterSeeds = seeds
        let client = try RedisClient(configuration: settings)
        let read: Result<DeviceRecords, RedisError>
        do {
            read = .success(try await DeviceRecords.read(token: token, topic: topic, keyPrefix: prefix,
                                                         startWindowSeconds: policy.rules(for: topic).liveActivity.startWindowSeconds, from: client))
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
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        func when(_ milliseconds: Int64) -> String {
            let date = Date(timeIntervalSince1970: Double(milliseconds) / 1000).formatted(.iso8601)
            // In doubles: the stored times are whatever Redis holds.
            let seconds = (Double(milliseconds) - Double(now)) / 1000
            return seconds >= 0 ? String(format: "in %.1f s (%@)", seconds, date) : String(format: "%.1f s ago (%@)", -seconds, date)
        }
        if let parked = records.parked {
            Terminal.line("parked: \(parked.id), due \(parked.at.map(when) ?? "?"), expires \(when(parked.expiration * 1000)): \(parked.intentJSON)")
        } else {
            Terminal.line("parked: none")
        }
        if let sending = records.sending {
            Terminal.line("being sent: \(sending.id) (claim ends \(sending.at.map(when) ?? "?")): \(sending.intentJSON)")
        }
        let limit = policy.rules(for: topic, recipient: token).rateLimit
        if !limit.isEnabled {
            Terminal.line("bucket: rate limit off for \(topic)")
        } else {
            let tokens = records.tokens(at: now, limit: limit)
            Terminal.line(String(format: "bucket: %.2f of %d tokens (refill %g/s%@)", tokens, limit.burst, limit.refillPerSecond,
                                 config == nil ? ", the default rules: pass --config for the file's" : ""))
        }
        if let unregisteredAt = records.unregisteredAt {
            Terminal.line("410 remembered: APNs said the token is dead since \(when(unregisteredAt)); intents without a newer token_registered_at are answered KnownUnregistered")
        }
        if topic.hasSuffix(PushType.liveactivity.topicSuffix) {
            let budgets = policy.rules(for: topic).liveActivity
            Terminal.line("live activity: \(records.priority10Spent) of \(budgets.priority10PerHour) priority-10 updates in the last hour, "
                          + "\(records.startsSpent) of \(budgets.startsPerWindow) starts in the last \(budgets.startWindowSeconds) s (0: not paced)")
        }
        if let until = records.backoffUntil, until > now {
            Terminal.line("429 backoff: until \(when(until)) (doubled \(records.backoffLevel ?? 0) times)")
        } else {
            Terminal.line("429 backoff: none")
        }
    }
}

extension RedisConfiguration.Mode: ExpressibleByArgument {}
