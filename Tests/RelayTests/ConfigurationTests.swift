import APNs
import Foundation
import Redis
@testable import Relay
import TestSupport
import Testing
import Yams

@Suite("Configuration", .timeLimit(.minutes(3)))
struct ConfigurationTests {
    /// Each YAML is refused, naming exactly these keys.
    static func expectRefused(_ bad: [(yaml: String, keys: Set<String>)], sourceLocation: SourceLocation = #_sourceLocation) {
        for (yaml, keys) in bad {
            do {
                _ = try RelayConfiguration.load(yaml: yaml, environment: [:])
                Issue.record("accepted: \(yaml)", sourceLocation: sourceLocation)
            } catch let error as ConfigurationError {
                #expect(Set(error.issues.map(\.key)) == keys, "\(yaml): \(error)", sourceLocation: sourceLocation)
            } catch {
                Issue.record("\(yaml): \(error)", sourceLocation: sourceLocation)
            }
        }
    }

    static var shippedFile: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("config/apns-relay.yaml").path
    }

    @Test func theShippedFileIsValidAndHoldsTheDefaults() throws {
        let configuration = try RelayConfiguration.load(file: Self.shippedFile, environment: [:])
        let defaults = RelayConfiguration()
        #expect(configuration.kafka.brokers == defaults.kafka.brokers)
        #expect(configuration.kafka.groupID == "apns-relay")
        #expect(configuration.kafka.intentsTopic == "apns.intents")
        #expect(configuration.kafka.outcomesTopic == "apns.outcomes")
        #expect(configuration.kafka.invalidationsTopic == "")
        #expect(configuration.apns.endpoint == "production")
        #expect(configuration.apns.connections == 2)
        #expect(configuration.limits.maxInFlight == 10_000)
        #expect(configuration.defaults.expirationSeconds == 86_400)
        #expect(configuration.http.port == 9464)
        #expect(configuration.redis.url == defaults.redis.url)
        #expect(configuration.redis.failOpen == defaults.redis.failOpen)
        #expect(configuration.redis.connections == defaults.redis.connections)
        #expect(configuration.redis.timeoutMilliseconds == defaults.redis.timeoutMilliseconds)
        #expect(configuration.redis.parkMinReplicas == defaults.redis.parkMinReplicas)
        #expect(configuration.redis.mode == defaults.redis.mode && configuration.redis.clusterSeeds.isEmpty)
        #expect(configuration.policy.dedupeWindowSeconds == defaults.policy.dedupeWindowSeconds)
        #expect(configuration.policy.defaults == defaults.policy.defaults)
        #expect(configuration.policy.topics.isEmpty)
        #expect(configuration.policy.mailboxPollMilliseconds == defaults.policy.mailboxPollMilliseconds)
        #expect(configuration.policy.mailboxClaimLeaseSeconds == 120 && defaults.policy.mailboxClaimLeaseSeconds == 120)
        #expect(configuration.policy.backoffInitialSeconds == defaults.policy.backoffInitialSeconds)
        #expect(configuration.policy.backoffMaxSeconds == defaults.policy.backoffMaxSeconds)
    }

    /// config/examples holds one intent per push type; the relay takes each as it is (the JSON
    /// Schema check runs in scripts/test, see scripts/check-schemas).
    /// YAML the relay cannot read as keys and values — a key that is itself a list or a map, a
    /// `!!set` — is a configuration error naming where it is, not a crash (found by fuzzing).
    @Test(arguments: ["? [a, b]\n: 1\n", "kafka:\n  {x: 1}: 2\n", "limits: !!set {a, b}\n", "- {[1]: 2}\n"])
    func keysThatAreNotPlainValuesAreRefused(_ yaml: String) throws {
        let error = try #require(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: yaml) }
        #expect(error.issues.count == 1)
        #expect(error.issues.first?.allowed.contains("keys must be plain values") == true, "\(error)")
    }

    /// Numbers YAML reads in base 60 (`1:30`) overflow in Yams past Int's range and stopped the
    /// process: they are read as text, and a number key holding one is refused as such.
    /// The intents config/examples/refused lists (the schema refuses them too: scripts/check-schemas)
    /// are refused at intake, with the case's `reason` (`BadPayload` unless it says) and the rule
    /// named.
    @Test(arguments: [("push-type-payloads.json", 16), ("topics.json", 5)])
    func theRefusedExamplesAreRefusedAtIntake(_ name: String, atLeast: Int) throws {
        let file = URL(fileURLWithPath: Self.shippedFile).deletingLastPathComponent()
            .appendingPathComponent("examples/refused/\(name)")
        let cases = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: file)) as? [[String: Any]])
        #expect(cases.count >= atLeast)
        for entry in cases {
            let why = entry["why"] as? String ?? "?"
            let intent = try JSONSerialization.data(withJSONObject: try #require(entry["intent"]))
            do {
                _ = try Intent.parse([UInt8](intent), key: nil, now: 1_732_000_000, defaultTTL: 86_400)
                Issue.record("accepted: \(why)")
            } catch {
                #expect(error.reason == entry["reason"] as? String ?? "BadPayload", "\(why): \(error.reason) \(error.message)")
            }
        }
    }

    @Test func aBase60NumberTooLargeIsAnErrorNotACrash() throws {
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "limits:\n  max_in_flight: 1:0:0:0:0:0:0:0:0:0:0\nx: 999999999999999999:0\n")
        }
        #expect(error.issues.contains { $0.key == "limits.max_in_flight" }, "\(error)")
    }

    /// Aliases that expand a small file into millions of values, and values nested deeper than
    /// any configuration needs, are refused before anything is made of them (no hang, no stack
    /// overflow).
    @Test func aliasBombsAndDeepNestingAreRefused() throws {
        var bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
        for level in 1...9 { bomb += "a\(level): &a\(level) [" + Array(repeating: "*a\(level - 1)", count: 10).joined(separator: ", ") + "]\n" }
        let deep = "x: " + String(repeating: "[", count: 900) + String(repeating: "]", count: 900) + "\n"
        for yaml in [bomb, deep] {
            let error = try #require(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: yaml) }
            #expect(error.issues.count == 1, "\(error)")
            #expect(error.issues.first?.key == "(file)", "\(error)")
        }
    }

    /// Yams hashes mapping keys while composing: an alias as a key stands for its whole value
    /// (exponential with nested aliases), so such documents are refused from their text.
    @Test func aliasesAsKeysAreRefusedBeforeYamsSeesThem() throws {
        let bomb = (1...9).reduce("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n") { text, level in
            text + "a\(level): &a\(level) [" + Array(repeating: "*a\(level - 1)", count: 10).joined(separator: ", ") + "]\n"
        }
        let keyed = ["limits: {max_in_flight: 5}\nk: [?*a]\n", "x: {*a: 1}\n", "x: [*a]: 1\n", "? *a\n: 1\n", "x: [*a, ?y]\n"]
        for yaml in keyed.map({ "a: &a [1]\n" + $0 }) + [bomb + "a10: [*a9, ?*a9]\n", bomb + "a10: {*a9: x}\n"] {
            #expect(RelayConfiguration.mayUseAliasAsKey(yaml), "\(yaml)")
            let error = try #require(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: yaml) }
            #expect(error.issues.first?.key == "(file)", "\(error)")
        }
        // Aliases as values, and colons or question marks inside quotes and comments, are fine.
        for yaml in ["a: &a 5\nb: *a\n", "a: &a x\nb: [*a, '?: x', \"*a: \\\" ?\"]  # *a: ?\n", "a: 'it''s *a: x'\nb: ?x\n"] {
            #expect(!RelayConfiguration.mayUseAliasAsKey(yaml), "\(yaml)")
        }
    }

    @Test func theExampleIntentsAreValidForTheRelay() throws {
        let directory = URL(fileURLWithPath: Self.shippedFile).deletingLastPathComponent().appendingPathComponent("examples")
        for pushType in PushType.allCases {
            let file = directory.appendingPathComponent("\(pushType.rawValue).json")
            let bytes = try [UInt8](Data(contentsOf: file))
            let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
            let token = try #require(object["token"] as? String)
            do {
                let intent = try Intent.parse(bytes, key: Array(token.utf8), now: 1_732_000_000, defaultTTL: 86_400)
                #expect(intent.pushType == pushType, "\(file.lastPathComponent)")
            } catch {
                Issue.record("\(file.lastPathComponent): \(error.reason): \(error.message)")
            }
        }
        // A push-to-start.
        let start = try [UInt8](Data(contentsOf: directory.appendingPathComponent("liveactivity-start.json")))
        #expect(try Intent.parse(start, key: nil, now: 1_732_000_000, defaultTTL: 86_400).pushType == .liveactivity)
        // The broadcast on a channel.
        let broadcast = try [UInt8](Data(contentsOf: directory.appendingPathComponent("broadcast.json")))
        let intent = try Intent.parse(broadcast, key: nil, now: 1_732_000_000, defaultTTL: 86_400)
        #expect(intent.channelID == "dHN0LTEyMzQ1Njc4OTAxMjM0NTY=" && intent.token.isEmpty && intent.pushType == .liveactivity)
        #expect(intent.messageStoragePolicy == 1 && intent.expiration == 1_732_086_400)
    }

    @Test func policyRulesApplyPerTopicOverTheGlobalOnes() throws {
        let configuration = try RelayConfiguration.load(yaml: """
            policy:
              dedupe_window_seconds: 3600
              rate_limit: {burst: 8, refill_per_second: 0.5}
              topics:
                com.example.game:
                  rate_limit: {burst: 3, refill_per_second: 0.05}
                  coalesce: false
                com.example.news:
                  dedupe_window_seconds: 60
            """, environment: ["APNS_RELAY_POLICY_RATE_LIMIT_BURST": "9"])
        let global = configuration.policy.rules(for: "com.example.app")
        #expect(global.rateLimit == .init(burst: 9, refillPerSecond: 0.5))
        #expect(global.dedupeWindowSeconds == 3600 && global.coalesce)
        let game = configuration.policy.rules(for: "com.example.game")
        #expect(game.rateLimit == .init(burst: 3, refillPerSecond: 0.05))
        #expect(!game.coalesce && game.dedupeWindowSeconds == 3600)
        let news = configuration.policy.rules(for: "com.example.news")
        #expect(news.dedupeWindowSeconds == 60 && news.rateLimit == global.rateLimit && news.coalesce)
        #expect(configuration.policy.longestDedupeWindowSeconds == 3600)
        #expect(configuration.redactedYAML.contains("rate_limit: {burst: 3, refill_per_second: 0.05}"))
        // Off: burst 0.
        let off = try RelayConfiguration.load(yaml: "policy: {rate_limit: {burst: 0}}", environment: [:])
        #expect(!off.policy.defaults.rateLimit.isEnabled)
        do {
            _ = try RelayConfiguration.load(yaml: """
                policy:
                  rate_limit: {burst: -1, refill_per_second: "fast", spare: 1}
                  coalesce: maybe
                  backoff_initial_seconds: 600
                  backoff_max_seconds: 60
                  topics:
                    com.example.game: {rate_limit: {refill_per_second: 0}, shape: round}
                    com.example.bad: 7
                """, environment: [:])
            Issue.record("bad policy settings were accepted")
        } catch let error as ConfigurationError {
            #expect(Set(error.issues.map(\.key)) == [
                "policy.rate_limit.burst", "policy.rate_limit.refill_per_second", "policy.rate_limit.spare", "policy.coalesce",
                "policy.backoff_max_seconds", "policy.topics.com.example.game.rate_limit.refill_per_second",
                "policy.topics.com.example.game.shape", "policy.topics.com.example.bad",
            ])
        }
    }

    @Test func redisSettingsAreCheckedAndTheirPasswordNeverShown() throws {
        let configuration = try RelayConfiguration.load(yaml: """
            redis:
              url: redis://:pa55word@cache:6380/2
              fail_open: true
            policy:
              dedupe_window_seconds: 600
            """, environment: ["APNS_RELAY_REDIS_TIMEOUT_MS": "250"])
        #expect(configuration.redis.failOpen)
        #expect(configuration.redis.timeoutMilliseconds == 250)
        #expect(configuration.policy.dedupeWindowSeconds == 600)
        #expect(!configuration.redactedYAML.contains("pa55word"))
        #expect(configuration.redactedYAML.contains("redis://:<redacted>@cache:6380/2"))
        let overridden = try RelayConfiguration.load(yaml: "", environment: ["APNS_RELAY_REDIS_URL": "redis://10.0.0.5"])
        #expect(overridden.redis.url == "redis://10.0.0.5")
        do {
            _ = try RelayConfiguration.load(yaml: """
                redis:
                  url: "http://:pa55word@cache"
                  connections: 0
                policy:
                  dedupe_window_seconds: 0
                  mailbox_claim_lease_seconds: 4
                  surprise: 1
                """, environment: [:])
            Issue.record("a bad redis configuration was accepted")
        } catch let error as ConfigurationError {
            #expect(Set(error.issues.map(\.key)) == ["redis.url", "redis.connections", "policy.dedupe_window_seconds",
                                                     "policy.mailbox_claim_lease_seconds", "policy.surprise"])
            #expect(!error.description.contains("pa55word"))
        }
    }

    @Test func aRedisClusterIsNamedByASeedAndMoreSeeds() throws {
        let cluster = try RelayConfiguration.load(yaml: """
            redis:
              url: rediss://:pa55word@redis-0.internal:6379
              mode: cluster
              cluster_seeds: [redis-1.internal:6379, "[fd00::2]:6380"]
            """, environment: [:])
        #expect(cluster.redis.mode == .cluster)
        #expect(cluster.redis.clusterSeeds == [RedisNodeAddress(host: "redis-1.internal", port: 6379), RedisNodeAddress(host: "fd00::2", port: 6380)])
        #expect(cluster.redactedYAML.contains("mode: cluster"))
        #expect(cluster.redactedYAML.contains(#"cluster_seeds: ["redis-1.internal:6379", "[fd00::2]:6380"]"#))
        #expect(try RelayConfiguration.load(yaml: cluster.redactedYAML.replacingOccurrences(of: "<redacted>", with: "x"),
                                            environment: [:]).redis.clusterSeeds == cluster.redis.clusterSeeds)
        // The environment sets both, the seeds as one comma-separated value.
        let overridden = try RelayConfiguration.load(yaml: "redis: {url: redis://10.0.0.5}", environment: [
            "APNS_RELAY_REDIS_MODE": "cluster", "APNS_RELAY_REDIS_CLUSTER_SEEDS": "10.0.0.6:6379, 10.0.0.7:6379",
        ])
        #expect(overridden.redis.mode == .cluster && overridden.redis.clusterSeeds.map(\.port) == [6379, 6379])
        #expect(try RelayConfiguration.load(yaml: "", environment: [:]).redis.mode == .standalone)
        let bad: [(yaml: String, keys: Set<String>)] = [
            ("redis: {url: redis://cache, mode: sharded}", ["redis.mode"]),
            ("redis: {url: redis://cache/3, mode: cluster}", ["redis.url"]),
            ("redis: {mode: cluster}", ["redis.url"]),
            ("redis: {url: redis://cache, mode: cluster, cluster_seeds: [cache-1, 'cache-2:0', 'a b:1', 7]}", ["redis.cluster_seeds"]),
            ("redis: {url: redis://cache, mode: cluster, cluster_seeds: {a: 1}}", ["redis.cluster_seeds"]),
            ("redis: {url: redis://cache, cluster_seeds: [cache-1:6379]}", ["redis.cluster_seeds"]),
        ]
        Self.expectRefused(bad)
    }

    @Test func aSentinelDeploymentIsNamedByItsSentinelsAndTheMastersName() throws {
        let sentinel = try RelayConfiguration.load(yaml: """
            redis:
              url: redis://:pa55word@sentinel-0.internal:26379/2
              mode: sentinel
              sentinels: [sentinel-1.internal:26379, sentinel-2.internal:26379]
              sentinel_master: cache
              sentinel_password: s3ntinel
            """, environment: [:])
        #expect(sentinel.redis.mode == .sentinel && sentinel.redis.sentinelMaster == "cache")
        #expect(sentinel.redis.sentinels.map(\.host) == ["sentinel-1.internal", "sentinel-2.internal"])
        let settings = try sentinel.redis.clientConfiguration()
        #expect(settings.sentinelPassword == "s3ntinel" && settings.url.database == 2 && settings.url.password == "pa55word")
        // Printed without either password, and read back the same.
        #expect(!sentinel.redactedYAML.contains("pa55word") && !sentinel.redactedYAML.contains("s3ntinel"))
        #expect(sentinel.redactedYAML.contains(#"sentinels: ["sentinel-1.internal:26379", "sentinel-2.internal:26379"]"#))
        let again = try RelayConfiguration.load(yaml: sentinel.redactedYAML.replacingOccurrences(of: "<redacted>", with: "x"), environment: [:])
        #expect(again.redis.sentinels == sentinel.redis.sentinels && again.redis.sentinelMaster == "cache")
        // The password from the environment (a Secret), and the defaults.
        let fromEnvironment = try RelayConfiguration.load(yaml: "redis: {url: redis://sentinel-0:26379, mode: sentinel}",
                                                          environment: ["APNS_RELAY_REDIS_SENTINEL_PASSWORD": "from-a-secret"])
        #expect(fromEnvironment.redis.sentinelPassword == "from-a-secret" && fromEnvironment.redis.sentinelMaster == "mymaster")
        let bad: [(yaml: String, keys: Set<String>)] = [
            ("redis: {mode: sentinel}", ["redis.url"]),
            ("redis: {url: redis://s0:26379, mode: sentinel, sentinel_master: ''}", ["redis.sentinel_master"]),
            ("redis: {url: redis://s0:26379, mode: sentinel, sentinel_master: 'my master'}", ["redis.sentinel_master"]),
            ("redis: {url: redis://s0:26379, mode: sentinel, sentinels: [s1]}", ["redis.sentinels"]),
            ("redis: {url: redis://cache, sentinels: [s1:26379]}", ["redis.sentinels"]),
            ("redis: {url: redis://cache, mode: cluster, sentinels: [s1:26379]}", ["redis.sentinels"]),
        ]
        Self.expectRefused(bad)
    }

    @Test func librdkafkaSettingsComeFromTheEnvironmentToo() throws {
        let configuration = try RelayConfiguration.load(yaml: """
            kafka:
              config:
                security.protocol: SASL_SSL
                sasl.mechanisms: SCRAM-SHA-512
            """, environment: ["APNS_RELAY_KAFKA_CONFIG_SASL_PASSWORD": "from-a-secret", "APNS_RELAY_KAFKA_CONFIG_SASL_USERNAME": "relay"])
        #expect(configuration.kafka.properties["sasl.password"] == "from-a-secret")
        #expect(configuration.kafka.properties["sasl.username"] == "relay")
        #expect(configuration.kafka.properties["security.protocol"] == "SASL_SSL")
        #expect(!configuration.redactedYAML.contains("from-a-secret"))
    }

    @Test func environmentOverridesScalars() throws {
        let configuration = try RelayConfiguration.load(file: Self.shippedFile, environment: [
            "APNS_RELAY_KAFKA_BROKERS": "kafka-1:9092,kafka-2:9092",
            "APNS_RELAY_LIMITS_MAX_IN_FLIGHT": "500",
            "APNS_RELAY_APNS_INSECURE_SKIP_VERIFY": "true",
            "APNS_RELAY_APNS_ENDPOINT": "https://127.0.0.1:2197",
        ])
        #expect(configuration.kafka.brokers == "kafka-1:9092,kafka-2:9092")
        #expect(configuration.limits.maxInFlight == 500)
        #expect(configuration.apns.insecureSkipVerify)
        #expect(configuration.apns.endpoint == "https://127.0.0.1:2197")
        #expect(RelayConfiguration.environmentName(forKey: "limits.max_in_flight") == "APNS_RELAY_LIMITS_MAX_IN_FLIGHT")
    }

    @Test func everyProblemIsReportedWithKeyValueAndWhatIsAllowed() throws {
        let yaml = """
            kafka:
              brokers: ""
              bogus: 1
            apns:
              endpoint: staging
              connections: 0
              credentials:
                - team_id: T
                  key_file: /nonexistent/AuthKey.p8
            limits:
              max_in_flight: lots
            http:
              port: 70000
            """
        do {
            _ = try RelayConfiguration.load(yaml: yaml, environment: ["APNS_RELAY_DEFAULTS_EXPIRATION_SECONDS": "-5"])
            Issue.record("a bad configuration was accepted")
        } catch let error as ConfigurationError {
            let keys = Set(error.issues.map(\.key))
            #expect(keys == [
                "kafka.bogus", "kafka.brokers", "apns.endpoint", "apns.connections", "apns.credentials[0].key_id",
                "apns.credentials[0].team_id", "apns.credentials[0].topics", "apns.credentials[0].key_file",
                "limits.max_in_flight", "http.port", "defaults.expiration_seconds",
            ])
            let connections = try #require(error.issues.first { $0.key == "apns.connections" })
            #expect(connections.value == "0")
            #expect(connections.allowed.contains("1...64"))
            #expect(error.description.contains("apns.endpoint = staging"))
        }
        #expect(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: "kafka: [unclosed", environment: [:]) }
        #expect(throws: ConfigurationError.self) { try RelayConfiguration.load(file: "/nonexistent.yaml", environment: [:]) }
    }

    /// The three topics are three: an outcome or an invalidation record written to the intents
    /// topic would come back as an intent. The invalidations topic is off unless named.
    @Test func eachTopicIsATopicOfItsOwn() throws {
        for (yaml, key) in [("kafka: {intents_topic: a, outcomes_topic: a}", "kafka.outcomes_topic"),
                            ("kafka: {intents_topic: a, outcomes_topic: b, invalidations_topic: a}", "kafka.invalidations_topic"),
                            ("kafka: {intents_topic: a, outcomes_topic: b, invalidations_topic: b}", "kafka.invalidations_topic")] {
            let error = try #require(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: yaml, environment: [:]) }
            #expect(error.issues.map(\.key) == [key], "\(yaml)")
        }
        let on = try RelayConfiguration.load(yaml: "kafka: {invalidations_topic: apns.invalidations}", environment: [:])
        #expect(on.kafka.invalidationsTopic == "apns.invalidations")
        #expect(on.redactedYAML.contains(#"invalidations_topic: "apns.invalidations""#))
        let overridden = try RelayConfiguration.load(yaml: "kafka: {invalidations_topic: apns.invalidations}",
                                                     environment: ["APNS_RELAY_KAFKA_INVALIDATIONS_TOPIC": ""])
        #expect(overridden.kafka.invalidationsTopic == "")
    }

    /// Remembering 410s needs Redis; the TTL has bounds.
    @Test func skippingKnownUnregisteredTokensNeedsRedis() throws {
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "policy: {skip_known_unregistered: true, known_unregistered_ttl_seconds: 5}", environment: [:])
        }
        #expect(Set(error.issues.map(\.key)) == ["policy.skip_known_unregistered", "policy.known_unregistered_ttl_seconds"])
        let on = try RelayConfiguration.load(yaml: "redis: {url: redis://127.0.0.1:6379}\npolicy: {skip_known_unregistered: true}",
                                             environment: [:])
        #expect(on.policy.skipKnownUnregistered && on.policy.knownUnregisteredTTLSeconds == 2_592_000)
    }

    /// Redis' TLS files: for a rediss:// URL only, a client certificate with its key, and the
    /// files read as the client reads them (check-config names one that does not parse).
    @Test func redisTLSFilesAreCheckedAsTheClientReadsThem() throws {
        func issues(_ yaml: String) -> [String] {
            do {
                _ = try RelayConfiguration.load(yaml: yaml, environment: [:])
                return []
            } catch let error as ConfigurationError {
                return error.issues.map(\.key)
            } catch {
                return ["\(error)"]
            }
        }
        #expect(issues("redis:\n  url: redis://cache:6379/0\n  tls_ca_file: /ca.pem\n") == ["redis.url"])
        #expect(issues("redis:\n  url: rediss://cache:6379/0\n  tls_cert_file: /c.pem\n") == ["redis.tls_key_file"])
        #expect(issues("redis:\n  url: rediss://cache:6379/0\n  tls_ca_file: /ca.pem\n  tls_cert_file: /c.pem\n  tls_key_file: /k.pem\n").isEmpty)
        let notPEM = TestFiles.path("not-a-ca-\(UUID()).pem").path
        try "not a certificate\n".write(toFile: notPEM, atomically: true, encoding: .utf8)
        let configuration = try RelayConfiguration.load(yaml: "redis:\n  url: rediss://cache:6379/0\n  tls_ca_file: \(notPEM)\n", environment: [:])
        let problems = RelayConfiguration.redisTLSProblems(configuration.redis)
        #expect(problems.count == 1 && problems[0].hasPrefix("redis.tls_ca_file \(notPEM)"), "\(problems)")
        #expect(configuration.redactedYAML.contains("tls_ca_file: \"\(notPEM)\""))
    }

    /// `policy.live_activity`: the defaults, a file's values, a topic's override over them, the
    /// environment, and values out of range refused by name.
    @Test func liveActivityBudgetsAreReadGloballyAndPerTopic() throws {
        let defaults = try RelayConfiguration.load(yaml: "", environment: [:]).policy.defaults.liveActivity
        #expect(defaults.priority10PerHour == 12 && defaults.startsPerWindow == 8 && defaults.startWindowSeconds == 3600)
        let configuration = try RelayConfiguration.load(yaml: """
            policy:
              live_activity: {priority10_per_hour: 30, starts_per_window: 5}
              topics:
                com.example.food.push-type.liveactivity:
                  live_activity: {priority10_per_hour: 0}
            """, environment: ["APNS_RELAY_POLICY_LIVE_ACTIVITY_START_WINDOW_SECONDS": "600"])
        let global = configuration.policy.defaults.liveActivity
        #expect(global.priority10PerHour == 30 && global.startsPerWindow == 5 && global.startWindowSeconds == 600)
        let topic = configuration.policy.rules(for: "com.example.food.push-type.liveactivity").liveActivity
        #expect(topic.priority10PerHour == 0 && topic.startsPerWindow == 5 && topic.startWindowSeconds == 600)
        #expect(try RelayConfiguration.load(yaml: configuration.redactedYAML, environment: [:]).policy.defaults.liveActivity == global)
        do {
            _ = try RelayConfiguration.load(yaml: "policy:\n  live_activity: {priority10_per_hour: -1, start_window_seconds: 0, surprise: 1}\n",
                                            environment: [:])
            Issue.record("bad budgets were accepted")
        } catch let error as ConfigurationError {
            #expect(Set(error.issues.map(\.key)) == ["policy.live_activity.priority10_per_hour", "policy.live_activity.start_window_seconds",
                                                     "policy.live_activity.surprise"])
        }
    }

    /// `policy.mode`: enforce unless set, shadow globally (file or environment) or for one topic
    /// only, kept through the redacted YAML; another value is refused by its key.
    @Test func thePolicyModeIsReadGloballyAndPerTopic() throws {
        #expect(try RelayConfiguration.load(yaml: "", environment: [:]).policy.defaults.mode == .enforce)
        let configuration = try RelayConfiguration.load(yaml: """
            policy:
              topics:
                com.example.new: {mode: shadow}
                com.example.old: {dedupe_window_seconds: 60}
            """, environment: [:])
        #expect(configuration.policy.rules(for: "com.example.new").mode == .shadow)
        #expect(configuration.policy.rules(for: "com.example.old").mode == .enforce)
        #expect(configuration.policy.rules(for: "com.example.other").mode == .enforce)
        // A channel takes its topic's mode.
        #expect(configuration.policy.rules(for: "com.example.new", recipient: "channel:dHJhY2s=").mode == .shadow)
        let reloaded = try RelayConfiguration.load(yaml: configuration.redactedYAML, environment: [:])
        #expect(reloaded.policy.rules(for: "com.example.new").mode == .shadow && reloaded.policy.defaults.mode == .enforce)
        let global = try RelayConfiguration.load(yaml: "", environment: ["APNS_RELAY_POLICY_MODE": "shadow"])
        #expect(global.policy.defaults.mode == .shadow && global.policy.rules(for: "com.example.any").mode == .shadow)
        for yaml in ["policy:\n  mode: dry-run\n", "policy:\n  topics:\n    com.example.new: {mode: Shadow}\n"] {
            do {
                _ = try RelayConfiguration.load(yaml: yaml, environment: [:])
                Issue.record("accepted: \(yaml)")
            } catch let error as ConfigurationError {
                #expect(error.issues.map(\.key) == [yaml.contains("topics") ? "policy.topics.com.example.new.mode" : "policy.mode"], "\(error)")
                #expect(error.issues.first?.allowed == "enforce or shadow")
            }
        }
    }

    /// `policy.channels.rate_limit`: off unless set, read from the file and the environment, kept
    /// through the redacted YAML, and refused by name out of range or with an unknown key.
    @Test func theChannelsRateLimitIsReadOnItsOwn() throws {
        let defaults = try RelayConfiguration.load(yaml: "", environment: [:]).policy.channels.rateLimit
        #expect(!defaults.isEnabled)
        let configuration = try RelayConfiguration.load(yaml: """
            policy:
              rate_limit: {burst: 3, refill_per_second: 0.05}
              channels:
                rate_limit: {burst: 4}
            """, environment: ["APNS_RELAY_POLICY_CHANNELS_RATE_LIMIT_REFILL_PER_SECOND": "0.5"])
        #expect(configuration.policy.channels.rateLimit == .init(burst: 4, refillPerSecond: 0.5))
        #expect(configuration.policy.defaults.rateLimit == .init(burst: 3, refillPerSecond: 0.05))
        // What admissions and mailbox takes go by, per recipient: a channel's bucket is its own.
        let channel = configuration.policy.rules(for: "com.example.app", recipient: "channel:dHN0")
        #expect(channel.rateLimit == .init(burst: 4, refillPerSecond: 0.5) && !channel.coalesce)
        #expect(configuration.policy.rules(for: "com.example.app", recipient: String(repeating: "ab", count: 32)).rateLimit
            == .init(burst: 3, refillPerSecond: 0.05))
        #expect(try RelayConfiguration.load(yaml: configuration.redactedYAML, environment: [:]).policy.channels == configuration.policy.channels)
        do {
            _ = try RelayConfiguration.load(yaml: "policy:\n  channels: {rate_limit: {burst: -1}, limit: 1}\n", environment: [:])
            Issue.record("a bad channel rate limit was accepted")
        } catch let error as ConfigurationError {
            #expect(Set(error.issues.map(\.key)) == ["policy.channels.rate_limit.burst", "policy.channels.limit"])
        }
    }

    /// `redis.key_prefix`: today's keys unless set; a prefix with braces (which would move every
    /// key's hash tag), spaces or nothing in it is refused.
    @Test func theRedisKeyPrefixKeepsTheHashTagsWhereTheyAre() throws {
        #expect(try RelayConfiguration.load(yaml: "", environment: [:]).redis.keyPrefix == "apns-relay:")
        let staging = try RelayConfiguration.load(yaml: "redis:\n  key_prefix: \"staging/apns-relay:\"\n", environment: [:])
        #expect(staging.redis.keyPrefix == "staging/apns-relay:")
        #expect(try RelayConfiguration.load(yaml: staging.redactedYAML, environment: [:]).redis.keyPrefix == "staging/apns-relay:")
        let fromEnvironment = try RelayConfiguration.load(yaml: "", environment: ["APNS_RELAY_REDIS_KEY_PREFIX": "tenant-b:"])
        #expect(fromEnvironment.redis.keyPrefix == "tenant-b:")
        for refused in ["", "{tenant}:", "a b:", "tab\t:", String(repeating: "x", count: 65), "ünicode:"] {
            do {
                _ = try RelayConfiguration.load(yaml: "redis:\n  key_prefix: \"\(refused)\"\n", environment: [:])
                Issue.record("key_prefix \(refused) was accepted")
            } catch let error as ConfigurationError {
                #expect(error.issues.map(\.key) == ["redis.key_prefix"], "\(refused)")
            }
        }
    }

    /// An `APNS_RELAY_` variable that names no key (a typo) is found, by name; the keys', the
    /// librdkafka settings', the log options' and a certificate's passphrase variable are not.
    @Test func misspeltEnvironmentVariablesAreFound() {
        let environment = ["APNS_RELAY_KAFKA_BROKERZ": "kafka:9092", "APNS_RELAY_KAFKA_BROKERS": "kafka:9092",
                           "APNS_RELAY_POLICY_RATE_LIMIT_BURST": "3", "APNS_RELAY_LIMITS_MAX_WAITING_PER_RECIPIENT": "10",
                           "APNS_RELAY_KAFKA_CONFIG_SASL_PASSWORD": "x", "APNS_RELAY_KAFKA_PRODUCER_CONFIG_LINGER_MS": "5",
                           "APNS_RELAY_LOG_FORMAT": "json", "APNS_RELAY_MDM_PASSPHRASE": "x", "APNS_RELAY_REDIS_URLL": "x",
                           "PATH": "/usr/bin", "APNS_RELAY": "x"]
        #expect(RelayConfiguration.unknownEnvironmentVariables(environment, passphraseVariables: ["APNS_RELAY_MDM_PASSPHRASE"])
                == ["APNS_RELAY_KAFKA_BROKERZ", "APNS_RELAY_REDIS_URLL"])
    }

    /// The shipped reference file lists every key the loader knows, and no other: the chart's
    /// schema is held to that file (scripts/check-chart), so the three cannot drift. Keys inside
    /// lists (credentials, lanes) and per-topic overrides are the exceptions the file shows in
    /// comments.
    @Test func theShippedFileListsEveryKeyTheLoaderKnows() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("config/apns-relay.yaml"), encoding: .utf8)
        let shipped = try #require(try Yams.load(yaml: text) as? [String: Any])
        let freeForm: Set<String> = ["kafka.config", "kafka.consumer_config", "kafka.producer_config", "policy.topics"]
        func keys(_ mapping: [String: Any], _ prefix: String) -> [String] {
            mapping.flatMap { name, value -> [String] in
                let key = prefix + name
                guard !freeForm.contains(key), let nested = value as? [String: Any] else { return [key] }
                return [key] + keys(nested, key + ".")
            }
        }
        var reader = ConfigurationReader(root: shipped, environment: [:])
        _ = reader.read()
        #expect(reader.issues.isEmpty, "\(reader.issues)")
        let known = reader.knownKeys.filter { !$0.contains("[") && !$0.hasPrefix("policy.topics.") }
        let listed = Set(keys(shipped, "")).union(["kafka.lanes"])
        #expect(known.subtracting(listed).isEmpty, "known to the loader, missing from config/apns-relay.yaml: \(known.subtracting(listed).sorted())")
        #expect(listed.subtracting(known).isEmpty, "in config/apns-relay.yaml, unknown to the loader: \(listed.subtracting(known).sorted())")
        #expect(text.contains("# lanes:"), "the lanes example stays in the file")
    }

    /// `enable.auto.commit: false` would leave offsets stored behind outcomes uncommitted until a
    /// revocation or a close (a crash then redelivers everything since the start): refused like
    /// the other settings that break the guarantees, in every map.
    @Test func autoCommitOffIsRefusedUnlessAllowed() throws {
        for yaml in ["kafka:\n  config:\n    enable.auto.commit: \"false\"\n",
                     "kafka:\n  consumer_config:\n    enable.auto.commit: \"0\"\n"] {
            do {
                _ = try RelayConfiguration.load(yaml: yaml, environment: [:])
                Issue.record("accepted: \(yaml)")
            } catch let error as ConfigurationError {
                #expect(error.issues.count == 1 && error.issues[0].key.hasSuffix("enable.auto.commit"), "\(error)")
            }
            #expect(try RelayConfiguration.load(yaml: yaml + "  allow_unsafe_config: true\n", environment: [:]).kafka.allowUnsafeConfig)
        }
        #expect(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "kafka: {}", environment: ["APNS_RELAY_KAFKA_CONSUMER_CONFIG_ENABLE_AUTO_COMMIT": "false"])
        }
        _ = try RelayConfiguration.load(yaml: "kafka:\n  config:\n    enable.auto.commit: \"true\"\n", environment: [:])
    }

    /// The consumer and the producer each get the shared `kafka.config` with their own map over
    /// it; neither sees the other's.
    @Test func consumerAndProducerSettingsAreKeptApart() throws {
        let configuration = try RelayConfiguration.load(yaml: """
            kafka:
              config:
                client.id: relay
                linger.ms: "5"
              consumer_config:
                fetch.wait.max.ms: "20"
                client.id: relay-consumer
              producer_config:
                linger.ms: "1"
                compression.type: zstd
            """, environment: ["APNS_RELAY_KAFKA_PRODUCER_CONFIG_BATCH_SIZE": "65536",
                               "APNS_RELAY_KAFKA_CONSUMER_CONFIG_SASL_PASSWORD": "consumer-secret"])
        #expect(configuration.kafka.consumerSettings == ["client.id": "relay-consumer", "linger.ms": "5", "fetch.wait.max.ms": "20",
                                                         "sasl.password": "consumer-secret"])
        #expect(configuration.kafka.producerSettings == ["client.id": "relay", "linger.ms": "1", "compression.type": "zstd",
                                                         "batch.size": "65536"])
        let yaml = configuration.redactedYAML
        #expect(yaml.contains("consumer_config:") && yaml.contains("producer_config:") && yaml.contains(#"compression.type: "zstd""#))
        #expect(!yaml.contains("consumer-secret"))
        // check-config's output reads back as the same configuration.
        let again = try RelayConfiguration.load(yaml: yaml.replacingOccurrences(of: "<redacted>", with: "consumer-secret"), environment: [:])
        #expect(again.kafka.consumerSettings == configuration.kafka.consumerSettings)
        #expect(again.kafka.producerSettings == configuration.kafka.producerSettings)
        // A setting librdkafka refuses is found in either map.
        #expect(throws: (any Error).self) {
            try RelayApplication.validateClientSettings(try RelayConfiguration.load(yaml: """
                kafka:
                  producer_config:
                    linger.ms: soon
                """, environment: [:]))
        }
    }

    /// librdkafka settings that would break at-least-once are refused, with what is allowed,
    /// unless the operator says so; the safe spellings of the same keys pass.
    @Test func settingsThatBreakTheGuaranteesAreRefusedUnlessAllowed() throws {
        let unsafe = """
            kafka:
              config:
                enable.auto.offset.store: "true"
                acks: "1"
                enable.idempotence: "false"
                auto.offset.reset: latest
                topic.request.required.acks: "0"
            """
        do {
            _ = try RelayConfiguration.load(yaml: unsafe, environment: [:])
            Issue.record("accepted")
        } catch let error as ConfigurationError {
            #expect(Set(error.issues.map(\.key)) == ["kafka.config.enable.auto.offset.store", "kafka.config.acks",
                                                     "kafka.config.enable.idempotence", "kafka.config.auto.offset.reset",
                                                     "kafka.config.topic.request.required.acks"])
            #expect(error.issues.allSatisfy { $0.allowed.contains("kafka.allow_unsafe_config: true") })
        }
        // From the environment too.
        #expect(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "kafka: {}", environment: ["APNS_RELAY_KAFKA_CONFIG_ACKS": "1"])
        }
        let allowed = try RelayConfiguration.load(yaml: unsafe + "\n  allow_unsafe_config: true", environment: [:])
        #expect(allowed.kafka.allowUnsafeConfig)
        #expect(allowed.kafka.properties["acks"] == "1")
        #expect(allowed.redactedYAML.contains("allow_unsafe_config: true"))
        let safe = try RelayConfiguration.load(yaml: """
            kafka:
              config:
                enable.auto.offset.store: "false"
                acks: "-1"
                enable.idempotence: "true"
                auto.offset.reset: earliest
            """, environment: [:])
        #expect(!safe.kafka.allowUnsafeConfig)
    }

    /// Every librdkafka key that carries a secret is redacted, whatever its spelling.
    @Test(arguments: ["ssl.key.pem", "ssl.key.password", "ssl.keystore.password", "sasl.password",
                      "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "ssl.certificate.pem.password",
                      "SASL.PASSWORD", "ssl_key.pem", "custom.secret.thing"])
    func everySecretBearingKafkaKeyIsRedacted(key: String) throws {
        #expect(RelayConfiguration.isSecret(key), "\(key)")
        let configuration = try RelayConfiguration.load(yaml: """
            kafka:
              config:
                \(key): "topsecretvalue"
            """, environment: [:])
        #expect(!configuration.redactedYAML.contains("topsecretvalue"), "\(key)")
    }

    @Test func keysWithoutSecretsStayReadable() {
        for key in ["security.protocol", "sasl.mechanism", "sasl.username", "ssl.ca.location", "ssl.endpoint.identification.algorithm",
                    "client.id", "ssl.certificate.location", "ssl.certificate.pem", "sasl.kerberos.keytab"] {
            #expect(!RelayConfiguration.isSecret(key), "\(key)")
        }
    }

    @Test func redactedOutputHidesSecrets() throws {
        let configuration = try RelayConfiguration.load(yaml: """
            kafka:
              config:
                security.protocol: SASL_SSL
                sasl.mechanism: PLAIN
                sasl.username: relay
                sasl.password: hunter2
                ssl.key.password: swordfish
            """, environment: [:])
        let text = configuration.redactedYAML
        #expect(!text.contains("hunter2"))
        #expect(!text.contains("swordfish"))
        #expect(text.contains(#"sasl.username: "relay""#))
        #expect(text.contains("SASL_SSL"))
    }
}
