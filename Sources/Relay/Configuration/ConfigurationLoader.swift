import Common
import APNs
import Foundation
import Redis
import Yams

/// One thing wrong with a configuration: the key, the value found and what is allowed.
public struct ConfigurationIssue: Sendable, Equatable, CustomStringConvertible {
    public var key: String
    /// The value as it may be shown (credentials redacted); nil when it is not shown at all (an
    /// unknown key's value).
    public var value: String?
    public var allowed: String

    public init(key: String, value: String?, allowed: String) {
        self.key = key
        self.value = value
        self.allowed = allowed
    }

    public var description: String { value.map { "\(key) = \($0): \(allowed)" } ?? "\(key): \(allowed)" }
}

/// Every problem found in a configuration, all at once.
public struct ConfigurationError: Error, Sendable, CustomStringConvertible {
    public var issues: [ConfigurationIssue]
    public var description: String { issues.map(\.description).joined(separator: "\n") }
}

extension RelayConfiguration {
    /// Reads a YAML file; see ``load(yaml:environment:)``.
    public static func load(file: String, environment: [String: String]? = nil) throws -> RelayConfiguration {
        let environment = environment ?? ProcessInfo.processInfo.environment
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw ConfigurationError(issues: [ConfigurationIssue(key: "(file)", value: file, allowed: "cannot read it: \(error.localizedDescription)")])
        }
        return try load(yaml: text, environment: environment)
    }

    /// Parses YAML, applies environment overrides and validates everything; throws one
    /// ``ConfigurationError`` listing every problem (unknown keys included).
    public static func load(yaml: String, environment: [String: String] = [:]) throws -> RelayConfiguration {
        if mayUseAliasAsKey(yaml) {
            throw ConfigurationError(issues: [ConfigurationIssue(
                key: "(file)", value: "an alias (*name) used as a key, followed by a `:` on its line, or next to an explicit key (?)",
                allowed: "aliases only as values, with nothing after them on their line")])
        }
        let node: Node?
        do {
            node = try Yams.compose(yaml: yaml, .default, yamlConstructor())
        } catch {
            throw ConfigurationError(issues: [ConfigurationIssue(key: "(file)", value: "YAML", allowed: "it does not parse: \(error)")])
        }
        // Refused before any value is made of the document: what would stop the process in
        // Yams or take it unbounded time and stack.
        if let node, let refused = refusal(in: node) { throw ConfigurationError(issues: [refused]) }
        let root = node?.any
        var reader = ConfigurationReader(root: root, environment: environment)
        let configuration = reader.read()
        guard reader.issues.isEmpty else { throw ConfigurationError(issues: reader.issues) }
        return configuration
    }
}

/// Walks the parsed YAML against the known keys, collecting issues instead of stopping.
struct ConfigurationReader {
    let root: Any?
    let environment: [String: String]
    var issues: [ConfigurationIssue] = []
    /// Every key the reader knows where it looked (`kafka.brokers`, `policy.rate_limit.burst`,
    /// ...): the loader's key table, which config/apns-relay.yaml and the chart's schema follow.
    private(set) var knownKeys: Set<String> = []

    init(root: Any?, environment: [String: String]) {
        self.root = root
        self.environment = environment
    }

    mutating func read() -> RelayConfiguration {
        var configuration = RelayConfiguration()
        let top = mapping(root, key: "(top level)") ?? [:]
        checkKnown(top, prefix: "", known: ["kafka", "apns", "limits", "defaults", "retry", "redis", "policy", "http", "tracing", "shutdown_deadline_seconds"])

        readKafka(mapping(top["kafka"], key: "kafka") ?? [:], into: &configuration)

        let apns = mapping(top["apns"], key: "apns") ?? [:]
        checkKnown(apns, prefix: "apns.", known: ["endpoint", "insecure_skip_verify", "connections", "credentials", "request_timeout_seconds",
                                                  "proxy", "no_proxy"])
        configuration.apns.endpoint = string(apns, "apns.endpoint", default: configuration.apns.endpoint)
        if configuration.apns.endpoint != "production", configuration.apns.endpoint != "development",
           (try? APNsEndpoint(parsing: configuration.apns.endpoint)) == nil {
            issues.append(.init(key: "apns.endpoint", value: configuration.apns.endpoint, allowed: "use production, development or https://HOST:PORT"))
        }
        configuration.apns.insecureSkipVerify = bool(apns, "apns.insecure_skip_verify", default: false)
        configuration.apns.connections = integer(apns, "apns.connections", default: 2, range: 1...64)
        configuration.apns.requestTimeoutSeconds = integer(apns, "apns.request_timeout_seconds", default: 10, range: 1...300)
        configuration.apns.proxy = string(apns, "apns.proxy", default: "")
        configuration.apns.noProxy = stringList(apns["no_proxy"], key: "apns.no_proxy").map { $0.trimmingCharacters(in: .whitespaces) }
        for entry in configuration.apns.noProxy {
            if let problem = APNsProxy.noProxyProblem(entry) {
                issues.append(.init(key: "apns.no_proxy", value: entry, allowed: "\(problem) (a name matches its subdomains too; \"*\" matches all)"))
            }
        }
        do {
            _ = try configuration.apns.parsedProxy()
        } catch {
            issues.append(.init(key: "apns.proxy", value: APNsProxy.redacted(configuration.apns.proxy),
                                allowed: "empty (direct), or http://[USER[:PASSWORD]@]HOST[:PORT] (percent-encode what needs it)"))
        }
        if let list = apns["credentials"] {
            if let items = list as? [Any] {
                for (index, item) in items.enumerated() {
                    if let credential = readCredential(item, key: "apns.credentials[\(index)]") {
                        configuration.apns.credentials.append(credential)
                    }
                }
            } else {
                issues.append(.init(key: "apns.credentials", value: describe(list), allowed: "it is a list of {team_id, key_id, key_file, topics} or {cert_file, key_file, passphrase_env, topics}"))
            }
        }

        let limits = mapping(top["limits"], key: "limits") ?? [:]
        checkKnown(limits, prefix: "limits.", known: ["max_in_flight", "max_waiting", "max_waiting_per_recipient", "max_uncommitted_per_partition"])
        configuration.limits.maxInFlight = integer(limits, "limits.max_in_flight", default: 10_000, range: 1...1_000_000)
        configuration.limits.maxWaiting = integer(limits, "limits.max_waiting", default: 50_000, range: 1...1_000_000)
        configuration.limits.maxWaitingPerRecipient = integer(limits, "limits.max_waiting_per_recipient", default: 1_000,
                                                              range: 1...1_000_000)
        configuration.limits.maxUncommittedPerPartition = integer(limits, "limits.max_uncommitted_per_partition", default: 200_000,
                                                                  range: 1_000...10_000_000)

        let defaults = mapping(top["defaults"], key: "defaults") ?? [:]
        checkKnown(defaults, prefix: "defaults.", known: ["expiration_seconds"])
        configuration.defaults.expirationSeconds = Int64(integer(defaults, "defaults.expiration_seconds", default: 86_400, range: 0...2_592_000))

        let retry = mapping(top["retry"], key: "retry") ?? [:]
        checkKnown(retry, prefix: "retry.", known: ["initial_backoff_ms", "max_backoff_ms", "deadline_seconds", "credential_fault_cooldown_seconds"])
        configuration.retry.initialBackoffMilliseconds = integer(retry, "retry.initial_backoff_ms", default: 200, range: 1...60_000)
        configuration.retry.maxBackoffMilliseconds = integer(retry, "retry.max_backoff_ms", default: 30_000, range: 1...600_000)
        configuration.retry.deadlineSeconds = Int64(integer(retry, "retry.deadline_seconds", default: 600, range: 1...2_592_000))
        configuration.retry.credentialFaultCooldownSeconds = Int64(integer(retry, "retry.credential_fault_cooldown_seconds", default: 300, range: 1...86_400))
        requireAtLeast("retry.max_backoff_ms", Int64(configuration.retry.maxBackoffMilliseconds),
                       "retry.initial_backoff_ms", Int64(configuration.retry.initialBackoffMilliseconds))

        readRedis(mapping(top["redis"], key: "redis") ?? [:], into: &configuration)

        let policy = mapping(top["policy"], key: "policy") ?? [:]
        checkKnown(policy, prefix: "policy.", known: ["dedupe_window_seconds", "rate_limit", "coalesce", "live_activity", "mode", "topics", "channels",
                                                           "mailbox_poll_ms",
                                                           "mailbox_claim_lease_seconds",
                                                           "backoff_initial_seconds", "backoff_max_seconds", "skip_known_unregistered",
                                                           "known_unregistered_ttl_seconds"])
        configuration.policy.defaults = readRules(policy, prefix: "policy.", base: RelayConfiguration.Policy.Rules())
        configuration.policy.mailboxPollMilliseconds = integer(policy, "policy.mailbox_poll_ms", default: 1000, range: 10...60_000)
        configuration.policy.mailboxClaimLeaseSeconds = integer(policy, "policy.mailbox_claim_lease_seconds", default: 120, range: 5...3600)
        configuration.policy.backoffInitialSeconds = Int64(integer(policy, "policy.backoff_initial_seconds", default: 60, range: 1...86_400))
        configuration.policy.backoffMaxSeconds = Int64(integer(policy, "policy.backoff_max_seconds", default: 3600, range: 1...86_400))
        requireAtLeast("policy.backoff_max_seconds", configuration.policy.backoffMaxSeconds,
                       "policy.backoff_initial_seconds", configuration.policy.backoffInitialSeconds)
        configuration.policy.skipKnownUnregistered = bool(policy, "policy.skip_known_unregistered", default: false)
        if configuration.policy.skipKnownUnregistered, configuration.redis.url.isEmpty {
            issues.append(.init(key: "policy.skip_known_unregistered", value: "true",
                                allowed: "it needs Redis (redis.url), where the 410s are remembered; false without it"))
        }
        configuration.policy.knownUnregisteredTTLSeconds = Int64(integer(policy, "policy.known_unregistered_ttl_seconds",
                                                                         default: 2_592_000, range: 60...315_360_000))
        let channels = mapping(policy["channels"], key: "policy.channels") ?? [:]
        checkKnown(channels, prefix: "policy.channels.", known: ["rate_limit"])
        configuration.policy.channels.rateLimit = readRateLimit(mapping(channels["rate_limit"], key: "policy.channels.rate_limit") ?? [:],
                                                                prefix: "policy.channels.", base: configuration.policy.channels.rateLimit)
        if let topics = mapping(policy["topics"], key: "policy.topics") {
            for (topic, value) in topics.sorted(by: { $0.key < $1.key }) {
                let prefix = "policy.topics.\(topic)."
                guard let fields = mapping(value, key: "policy.topics.\(topic)") else { continue }
                checkKnown(fields, prefix: prefix, known: ["dedupe_window_seconds", "rate_limit", "coalesce", "live_activity", "mode"])
                configuration.policy.topics[topic] = readRules(fields, prefix: prefix, base: configuration.policy.defaults,
                                                               overridable: false)
            }
        }

        let http = mapping(top["http"], key: "http") ?? [:]
        checkKnown(http, prefix: "http.", known: ["address", "port", "request_timeout_seconds", "max_connections"])
        configuration.http.address = string(http, "http.address", default: configuration.http.address, nonEmpty: true)
        configuration.http.port = integer(http, "http.port", default: configuration.http.port, range: 0...65535)
        configuration.http.requestTimeoutSeconds = integer(http, "http.request_timeout_seconds",
                                                           default: configuration.http.requestTimeoutSeconds, range: 1...300)
        configuration.http.maxConnections = integer(http, "http.max_connections", default: configuration.http.maxConnections,
                                                    range: 1...100_000)
        let tracing = mapping(top["tracing"], key: "tracing") ?? [:]
        checkKnown(tracing, prefix: "tracing.", known: ["otlp_endpoint", "otlp_protocol"])
        configuration.tracing.otlpEndpoint = string(tracing, "tracing.otlp_endpoint", default: configuration.tracing.otlpEndpoint)
        if !configuration.tracing.otlpEndpoint.isEmpty, OTLPEndpoint(configuration.tracing.otlpEndpoint) == nil {
            issues.append(.init(key: "tracing.otlp_endpoint", value: URLCredentials.redacted(configuration.tracing.otlpEndpoint),
                                allowed: "empty, or http://HOST:PORT or https://HOST:PORT (an OTLP/HTTP collector)"))
        }
        let encoding = string(tracing, "tracing.otlp_protocol", default: configuration.tracing.otlpProtocol.rawValue)
        if let known = OTLPProtocol(rawValue: encoding) {
            configuration.tracing.otlpProtocol = known
        } else {
            issues.append(.init(key: "tracing.otlp_protocol", value: encoding,
                                allowed: encoding == "http/json" ? OTLPProtocol.jsonRefusal
                                    : OTLPProtocol.allCases.map(\.rawValue).joined(separator: " or ")))
        }
        configuration.shutdownDeadlineSeconds = integer(top, "shutdown_deadline_seconds", default: 20, range: 1...3600)
        return configuration
    }

    /// Reports `key` when its value is below `lowerKey`'s.
    private mutating func requireAtLeast(_ key: String, _ value: Int64, _ lowerKey: String, _ lower: Int64) {
        if value < lower {
            issues.append(.init(key: key, value: "\(value)", allowed: "it must be at least \(lowerKey) (\(lower))"))
        }
    }

    /// The token bucket under `prefix` + `rate_limit.`, keys absent taking `base`'s values.
    private mutating func readRateLimit(_ limit: [String: Any], prefix: String, base: RelayConfiguration.Policy.RateLimit,
                                        overridable: Bool = true) -> RelayConfiguration.Policy.RateLimit {
        for name in ["burst", "refill_per_second"] { knownKeys.insert(prefix + "rate_limit." + name) }
        checkKnown(limit, prefix: prefix + "rate_limit.", known: ["burst", "refill_per_second"])
        return RelayConfiguration.Policy.RateLimit(
            burst: integer(limit, prefix + "rate_limit.burst", default: base.burst, range: 0...100_000, overridable: overridable),
            refillPerSecond: number(limit, prefix + "rate_limit.refill_per_second", default: base.refillPerSecond,
                                    range: 0.000_1...10_000, overridable: overridable))
    }

    /// Policy rules under `prefix`, keys absent taking `base`'s values.
    private mutating func readRules(_ fields: [String: Any], prefix: String, base: RelayConfiguration.Policy.Rules,
                                    overridable: Bool = true) -> RelayConfiguration.Policy.Rules {
        var rules = base
        rules.dedupeWindowSeconds = Int64(integer(fields, prefix + "dedupe_window_seconds", default: Int(base.dedupeWindowSeconds),
                                                  range: 1...2_592_000, overridable: overridable))
        rules.coalesce = bool(fields, prefix + "coalesce", default: base.coalesce, overridable: overridable)
        let mode = string(fields, prefix + "mode", default: base.mode.rawValue, overridable: overridable)
        if let known = RelayConfiguration.Policy.Mode(rawValue: mode) {
            rules.mode = known
        } else {
            issues.append(.init(key: prefix + "mode", value: describe(mode), allowed: "enforce or shadow"))
        }
        if let limit = mapping(fields["rate_limit"], key: prefix + "rate_limit") {
            rules.rateLimit = readRateLimit(limit, prefix: prefix, base: base.rateLimit, overridable: overridable)
        } else if overridable {
            // Environment overrides apply to the global rules even without the mapping in the file.
            rules.rateLimit = readRateLimit([:], prefix: prefix, base: base.rateLimit)
        }
        let budgets = prefix + "live_activity."
        for name in ["priority10_per_hour", "starts_per_window", "start_window_seconds"] { knownKeys.insert(budgets + name) }
        let live = mapping(fields["live_activity"], key: prefix + "live_activity")
        if let live { checkKnown(live, prefix: budgets, known: ["priority10_per_hour", "starts_per_window", "start_window_seconds"]) }
        if live != nil || overridable {
            let fields = live ?? [:]
            rules.liveActivity.priority10PerHour = integer(fields, budgets + "priority10_per_hour", default: base.liveActivity.priority10PerHour,
                                                           range: 0...3600, overridable: overridable)
            rules.liveActivity.startsPerWindow = integer(fields, budgets + "starts_per_window", default: base.liveActivity.startsPerWindow,
                                                         range: 0...1000, overridable: overridable)
            rules.liveActivity.startWindowSeconds = Int64(integer(fields, budgets + "start_window_seconds",
                                                                  default: Int(base.liveActivity.startWindowSeconds),
                                                                  range: 1...86_400, overridable: overridable))
        }
        return rules
    }

    // MARK: Scalars

    mutating func mapping(_ value: Any?, key: String) -> [String: Any]? {
        guard let value, !(value is NSNull) else { return nil }
        if let dictionary = value as? [AnyHashable: Any] {
            var result: [String: Any] = [:]
            for (name, entry) in dictionary { result["\(name.base)"] = entry }
            return result
        }
        if let dictionary = value as? [String: Any] { return dictionary }
        issues.append(.init(key: key, value: describe(value), allowed: "it must be a mapping"))
        return nil
    }

    mutating func checkKnown(_ fields: [String: Any], prefix: String, known: Set<String>) {
        for name in known { knownKeys.insert(prefix + name) }
        for name in fields.keys.sorted() where !known.contains(name) {
            // Its value is not shown: a misspelt key may hold a secret (`pasword: ...`).
            issues.append(.init(key: prefix + name, value: nil,
                                allowed: "unknown key; known here: \(known.sorted().joined(separator: ", "))"))
        }
    }

    /// A list of strings: a YAML list, or one comma-separated string (as an environment
    /// override gives it).
    mutating func stringList(_ value: Any?, key: String) -> [String] {
        var items: [Any] = []
        if let overridden = override(key) {
            items = overridden.split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }
        } else if let list = value as? [Any] {
            items = list
        } else if let text = value as? String {
            items = text.split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }
        } else if value != nil {
            issues.append(.init(key: key, value: describe(value), allowed: "a list of strings"))
        }
        return items.compactMap { item in
            guard let text = item as? String, !text.isEmpty else {
                issues.append(.init(key: key, value: describe(item), allowed: "each entry is a non-empty string"))
                return nil
            }
            return text
        }
    }

    /// The value given for `key` (its last path component in `fields`), or its environment
    /// override.
    private func value(_ fields: [String: Any], _ key: String, overridable: Bool) -> Any? {
        if overridable, let overridden = override(key) { return overridden }
        return fields[String(key.split(separator: ".").last ?? "")]
    }

    /// The environment override for `key`, if set.
    func override(_ key: String) -> String? {
        environment[RelayConfiguration.environmentName(forKey: key)]
    }

    mutating func string(_ fields: [String: Any], _ key: String, default fallback: String,
                                 nonEmpty: Bool = false, overridable: Bool = true) -> String {
        let name = String(key.split(separator: ".").last ?? "")
        var value: String? = fields[name].flatMap(scalarText)
        if fields[name] != nil, value == nil {
            issues.append(.init(key: key, value: describe(fields[name]), allowed: "it must be a string"))
        }
        if overridable, let overridden = override(key) { value = overridden }
        let result = value ?? fallback
        if nonEmpty, result.isEmpty {
            issues.append(.init(key: key, value: "\"\"", allowed: "it must not be empty"))
        }
        return result
    }

    mutating func integer(_ fields: [String: Any], _ key: String, default fallback: Int, range: ClosedRange<Int>,
                                  overridable: Bool = true) -> Int {
        guard let raw = value(fields, key, overridable: overridable) else { return fallback }
        let parsed: Int? = (raw as? Int) ?? (raw as? String).flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard let parsed, !(raw is Bool) else {
            issues.append(.init(key: key, value: describe(raw), allowed: "it must be a whole number in \(range.lowerBound)...\(range.upperBound)"))
            return fallback
        }
        guard range.contains(parsed) else {
            issues.append(.init(key: key, value: "\(parsed)", allowed: "it must be in \(range.lowerBound)...\(range.upperBound)"))
            return fallback
        }
        return parsed
    }

    private mutating func number(_ fields: [String: Any], _ key: String, default fallback: Double, range: ClosedRange<Double>,
                                 overridable: Bool = true) -> Double {
        guard let raw = value(fields, key, overridable: overridable) else { return fallback }
        let parsed: Double? = (raw as? Double) ?? (raw as? Int).map(Double.init)
            ?? (raw as? String).flatMap { Double($0.trimmingCharacters(in: .whitespaces)) }
        guard let parsed, !(raw is Bool), parsed.isFinite, range.contains(parsed) else {
            issues.append(.init(key: key, value: describe(raw), allowed: "it must be a number in \(range.lowerBound)...\(range.upperBound)"))
            return fallback
        }
        return parsed
    }

    mutating func bool(_ fields: [String: Any], _ key: String, default fallback: Bool, overridable: Bool = true) -> Bool {
        guard let raw = value(fields, key, overridable: overridable) else { return fallback }
        if let value = raw as? Bool { return value }
        if let text = raw as? String {
            switch text.lowercased() {
            case "true", "yes", "1": return true
            case "false", "no", "0": return false
            default: break
            }
        }
        issues.append(.init(key: key, value: describe(raw), allowed: "it must be true or false"))
        return fallback
    }

    func scalarText(_ value: Any) -> String? {
        switch value {
        case let text as String: text
        case let number as Int: String(number)
        case let number as Double: String(number)
        case let flag as Bool: String(flag)
        default: nil
        }
    }

    func describe(_ value: Any?) -> String {
        guard let value else { return "(missing)" }
        if let text = value as? String { return "\"\(text)\"" }
        if value is [Any] { return "(a list)" }
        if value is [AnyHashable: Any] || value is [String: Any] { return "(a mapping)" }
        return "\(value)"
    }
}
