import Common
import Foundation
import Redis

extension RelayConfiguration {
    /// The effective configuration as YAML, secrets redacted.
    public var redactedYAML: String {
        func quote(_ text: String) -> String { JSONObjectWriter.quote(text) }
        var lines: [String] = []
        lines.append("kafka:")
        lines.append("  brokers: \(quote(kafka.brokers))")
        lines.append("  group_id: \(quote(kafka.groupID))")
        if kafka.lanes.isEmpty {
            lines.append("  intents_topic: \(quote(kafka.intentsTopic))")
        } else {
            lines.append("  lanes:")
            for lane in kafka.lanes { lines.append("    - {topic: \(quote(lane.topic)), weight: \(lane.weight)}") }
        }
        lines.append("  outcomes_topic: \(quote(kafka.outcomesTopic))")
        lines.append("  invalidations_topic: \(quote(kafka.invalidationsTopic))")
        for (section, properties) in zip(Kafka.propertySections, [kafka.properties, kafka.consumerProperties, kafka.producerProperties]) {
            lines.append(properties.isEmpty ? "  \(section): {}" : "  \(section):")
            for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
                lines.append("    \(key): \(quote(Self.isSecret(key) ? "<redacted>" : value))")
            }
        }
        if kafka.allowUnsafeConfig { lines.append("  allow_unsafe_config: true") }
        lines.append("  unready_after_unreachable_seconds: \(kafka.unreadyAfterUnreachableSeconds)")
        lines.append("apns:")
        lines.append("  endpoint: \(quote(apns.endpoint))")
        lines.append("  insecure_skip_verify: \(apns.insecureSkipVerify)")
        lines.append("  connections: \(apns.connections)")
        lines.append("  request_timeout_seconds: \(apns.requestTimeoutSeconds)")
        lines.append("  proxy: \(quote(apns.proxy.isEmpty ? "" : (try? apns.parsedProxy())??.description ?? "<redacted>"))")
        lines.append("  no_proxy: [\(apns.noProxy.map(quote).joined(separator: ", "))]")
        lines.append(apns.credentials.isEmpty ? "  credentials: []" : "  credentials:")
        for credential in apns.credentials {
            switch credential.kind {
            case .token(let teamID, let keyID, let keyFile):
                lines.append("    - team_id: \(quote(teamID))")
                lines.append("      key_id: \(quote(keyID))")
                lines.append("      key_file: \(quote(keyFile))")
            case .certificate(let certificateFile, let keyFile, let passphraseEnvironment):
                lines.append("    - cert_file: \(quote(certificateFile))")
                if let keyFile { lines.append("      key_file: \(quote(keyFile))") }
                if let passphraseEnvironment { lines.append("      passphrase_env: \(quote(passphraseEnvironment))") }
            }
            if !credential.topics.isEmpty || !credential.isCertificate {
                lines.append("      topics: [\(credential.topics.map(quote).joined(separator: ", "))]")
            }
        }
        lines.append("limits:")
        lines.append("  max_in_flight: \(limits.maxInFlight)")
        lines.append("  max_waiting: \(limits.maxWaiting)")
        lines.append("  max_waiting_per_recipient: \(limits.maxWaitingPerRecipient)")
        lines.append("  max_uncommitted_per_partition: \(limits.maxUncommittedPerPartition)")
        lines.append("defaults:")
        lines.append("  expiration_seconds: \(defaults.expirationSeconds)")
        lines.append("retry:")
        lines.append("  initial_backoff_ms: \(retry.initialBackoffMilliseconds)")
        lines.append("  max_backoff_ms: \(retry.maxBackoffMilliseconds)")
        lines.append("  deadline_seconds: \(retry.deadlineSeconds)")
        lines.append("  credential_fault_cooldown_seconds: \(retry.credentialFaultCooldownSeconds)")
        lines.append("redis:")
        lines.append("  url: \(quote(redis.url.isEmpty ? "" : (try? RedisURL(parsing: redis.url))?.description ?? "<redacted>"))")
        lines.append("  mode: \(redis.mode.rawValue)")
        if !redis.clusterSeeds.isEmpty {
            lines.append("  cluster_seeds: [\(redis.clusterSeeds.map { quote($0.description) }.joined(separator: ", "))]")
        }
        if redis.mode == .sentinel {
            lines.append("  sentinels: [\(redis.sentinels.map { quote($0.description) }.joined(separator: ", "))]")
            lines.append("  sentinel_master: \(quote(redis.sentinelMaster))")
            lines.append("  sentinel_password: \(quote(redis.sentinelPassword.isEmpty ? "" : "<redacted>"))")
        }
        lines.append("  fail_open: \(redis.failOpen)")
        lines.append("  allow_eviction: \(redis.allowEviction)")
        lines.append("  connections: \(redis.connections)")
        lines.append("  timeout_ms: \(redis.timeoutMilliseconds)")
        lines.append("  park_min_replicas: \(redis.parkMinReplicas)")
        lines.append("  key_prefix: \(quote(redis.keyPrefix))")
        lines.append("  tls_ca_file: \(quote(redis.tlsCAFile))")
        lines.append("  tls_cert_file: \(quote(redis.tlsCertFile))")
        lines.append("  tls_key_file: \(quote(redis.tlsKeyFile))")
        lines.append("policy:")
        func rateLimit(_ limit: Policy.RateLimit) -> String {
            "rate_limit: {burst: \(limit.burst), refill_per_second: \(limit.refillPerSecond)}"
        }
        func rules(_ rules: Policy.Rules, indent: String) {
            lines.append("\(indent)dedupe_window_seconds: \(rules.dedupeWindowSeconds)")
            lines.append("\(indent)\(rateLimit(rules.rateLimit))")
            lines.append("\(indent)coalesce: \(rules.coalesce)")
            lines.append("\(indent)mode: \(rules.mode.rawValue)")
            let live = rules.liveActivity
            lines.append("\(indent)live_activity: {priority10_per_hour: \(live.priority10PerHour), starts_per_window: \(live.startsPerWindow), "
                         + "start_window_seconds: \(live.startWindowSeconds)}")
        }
        rules(policy.defaults, indent: "  ")
        lines.append("  channels: {\(rateLimit(policy.channels.rateLimit))}")
        lines.append("  mailbox_poll_ms: \(policy.mailboxPollMilliseconds)")
        lines.append("  mailbox_claim_lease_seconds: \(policy.mailboxClaimLeaseSeconds)")
        lines.append("  backoff_initial_seconds: \(policy.backoffInitialSeconds)")
        lines.append("  backoff_max_seconds: \(policy.backoffMaxSeconds)")
        lines.append("  skip_known_unregistered: \(policy.skipKnownUnregistered)")
        lines.append("  known_unregistered_ttl_seconds: \(policy.knownUnregisteredTTLSeconds)")
        lines.append(policy.topics.isEmpty ? "  topics: {}" : "  topics:")
        for (topic, topicRules) in policy.topics.sorted(by: { $0.key < $1.key }) {
            lines.append("    \(quote(topic)):")
            rules(topicRules, indent: "      ")
        }
        lines.append("http:")
        lines.append("  address: \(quote(http.address))")
        lines.append("  port: \(http.port)")
        lines.append("  request_timeout_seconds: \(http.requestTimeoutSeconds)")
        lines.append("  max_connections: \(http.maxConnections)")
        lines.append("tracing:")
        lines.append("  otlp_endpoint: \(quote(URLCredentials.redacted(tracing.otlpEndpoint)))")
        lines.append("  otlp_protocol: \(quote(tracing.otlpProtocol.rawValue))")
        lines.append("shutdown_deadline_seconds: \(shutdownDeadlineSeconds)")
        return lines.joined(separator: "\n")
    }

    /// librdkafka settings whose values are secrets (passwords, secrets, tokens, private keys
    /// inline as PEM, OAuth configuration), in any case and with `_` for `.`; paths to files
    /// (`*.location`, keytabs) are not.
    static func isSecret(_ key: String) -> Bool {
        let name = key.lowercased().replacingOccurrences(of: "_", with: ".")
        return ["password", "secret", "token", "sasl.oauthbearer.config", ".key.pem"].contains { name.contains($0) }
            || name.hasSuffix(".key")
    }
}
