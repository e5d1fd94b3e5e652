import Common
public import APNs
public import Redis

/// Everything `apns-relay run` needs. Loaded from YAML by ``RelayConfiguration/load(yaml:environment:)``;
/// every key, its default and what it allows is listed in docs/configuration.md.
public struct RelayConfiguration: Sendable {
    public struct Kafka: Sendable {
        public var brokers = "127.0.0.1:9092"
        public var groupID = "apns-relay"
        /// The intents topic when there is one lane; with ``lanes``, the first lane's topic.
        public var intentsTopic = "apns.intents"
        /// `kafka.lanes`: intents topics read by one consumer group, each with its weight (its
        /// share of `limits.max_in_flight` while other lanes have work). Empty: one lane,
        /// ``intentsTopic``.
        public var lanes: [Lane] = []
        public var outcomesTopic = "apns.outcomes"
        /// Empty: off. Else a compacted topic that gets one record per `unregistered` outcome
        /// and a tombstone per `delivered` one, keyed `<topic>/<token>` (``Invalidation``).
        public var invalidationsTopic = ""
        /// The sections of librdkafka settings, in the order they apply: `kafka.config` (both
        /// clients), then each client's own.
        public static let propertySections = ["config", "consumer_config", "producer_config"]

        /// `kafka.config`: passed to librdkafka as they are (security.protocol, sasl.*, ...), for
        /// the consumer and the producer alike.
        public var properties: [String: String] = [:]
        /// `kafka.consumer_config`: the consumer's own settings, over ``properties``.
        public var consumerProperties: [String: String] = [:]
        /// `kafka.producer_config`: the producer's own settings, over ``properties``.
        public var producerProperties: [String: String] = [:]

        /// What the consumer (and a topic reader) is given: ``properties`` with
        /// ``consumerProperties`` over them.
        public var consumerSettings: [String: String] { properties.merging(consumerProperties) { _, own in own } }
        /// What the producer is given: ``properties`` with ``producerProperties`` over them.
        public var producerSettings: [String: String] { properties.merging(producerProperties) { _, own in own } }
        /// Accept librdkafka settings that break at-least-once (see ``guaranteeBreaking(_:_:)``).
        public var allowUnsafeConfig = false
        /// How long the consumer may have no broker connection up before `/readyz` says the
        /// relay is not ready (from librdkafka's statistics, every `statistics.interval.ms`).
        public var unreadyAfterUnreachableSeconds = 60
        public init() {}

        /// A priority lane: an intents topic and its weight.
        public struct Lane: Sendable, Equatable {
            public var topic: String
            public var weight: Int

            public init(topic: String, weight: Int) {
                self.topic = topic
                self.weight = weight
            }
        }

        /// The lanes the relay consumes: ``lanes``, or ``intentsTopic`` alone (weight 1).
        public var intentLanes: [Lane] { lanes.isEmpty ? [Lane(topic: intentsTopic, weight: 1)] : lanes }

        /// The intents topics of every lane.
        public var intentTopics: [String] { intentLanes.map(\.topic) }

        /// What a librdkafka setting must be for the relay to keep its guarantees, or nil when
        /// `value` keeps them: offsets stored only behind published outcomes, outcomes
        /// acknowledged by every in-sync replica and written once, a new group reading from the
        /// start of the topic.
        public static func guaranteeBreaking(_ name: String, _ value: String) -> String? {
            let value = value.lowercased()
            switch name.lowercased().replacingOccurrences(of: "_", with: ".") {
            case "enable.auto.offset.store":
                return ["false", "0"].contains(value) ? nil : "false: the relay stores an offset once its outcome is out"
            case "enable.auto.commit":
                return ["false", "0"].contains(value)
                    ? "true: stored offsets are committed every auto.commit.interval.ms (with false, only at a revocation or a close)" : nil
            case "acks", "request.required.acks", "topic.acks", "topic.request.required.acks":
                return ["all", "-1"].contains(value) ? nil : "all: an outcome is acknowledged by every in-sync replica"
            case "enable.idempotence":
                return ["true", "1"].contains(value) ? nil : "true: a retried outcome is written once"
            case "auto.offset.reset", "topic.auto.offset.reset":
                return ["earliest", "smallest", "beginning", "error"].contains(value)
                    ? nil : "earliest or error: a new group or a lost position must not skip intents"
            default:
                return nil
            }
        }
    }

    /// One `apns.credentials` entry: a token credential (`team_id`, `key_id`, `key_file`, the
    /// `.p8` signing key) or a certificate credential (`cert_file` with `key_file`, PEM, or
    /// `cert_file` alone, PKCS#12; `passphrase_env` names the environment variable holding the
    /// passphrase).
    public struct Credential: Sendable, Equatable {
        public enum Kind: Sendable, Equatable {
            case token(teamID: String, keyID: String, keyFile: String)
            case certificate(certificateFile: String, keyFile: String?, passphraseEnvironment: String?)
        }

        public var kind: Kind
        /// Bundle ids these credentials send for (push-type suffixes are matched too). A
        /// certificate credential may leave them out: the certificate's own topics are used.
        public var topics: [String]

        public init(teamID: String, keyID: String, keyFile: String, topics: [String]) {
            self.kind = .token(teamID: teamID, keyID: keyID, keyFile: keyFile)
            self.topics = topics
        }

        public init(certificateFile: String, keyFile: String? = nil, passphraseEnvironment: String? = nil, topics: [String] = []) {
            self.kind = .certificate(certificateFile: certificateFile, keyFile: keyFile, passphraseEnvironment: passphraseEnvironment)
            self.topics = topics
        }

        /// The files the credential is read from (a reload watches them).
        public var files: [String] {
            switch kind {
            case .token(_, _, let keyFile): [keyFile]
            case .certificate(let certificateFile, let keyFile, _): [certificateFile] + (keyFile.map { [$0] } ?? [])
            }
        }

        public var isCertificate: Bool {
            if case .certificate = kind { return true }
            return false
        }

        /// How logs name it: `TEAM:KEY` or the certificate file.
        public var name: String {
            switch kind {
            case .token(let teamID, let keyID, _): "\(teamID):\(keyID)"
            case .certificate(let certificateFile, _, _): certificateFile
            }
        }
    }

    public struct APNsSettings: Sendable {
        /// `production`: Apple's hosts, chosen by each intent's `environment`; `development`:
        /// Apple's sandbox for every intent; `https://HOST:PORT`: that server for every intent.
        public var endpoint = "production"
        public var insecureSkipVerify = false
        public var connections = 2
        public var credentials: [Credential] = []
        /// How long one request may take (seconds).
        public var requestTimeoutSeconds = 10
        /// `http://[user[:password]@]host[:port]`: APNs connections tunnel through this HTTP
        /// proxy (`CONNECT`); empty: direct.
        public var proxy = ""
        /// Hosts reached directly even with a proxy (a name and its subdomains; `*`: all).
        public var noProxy: [String] = []
        public init() {}

        /// ``proxy`` parsed (with ``noProxy``), or nil when there is none.
        public func parsedProxy() throws(APNsError) -> APNsProxy? {
            proxy.isEmpty ? nil : try APNsProxy(parsing: proxy, noProxy: noProxy)
        }
    }

    public struct Limits: Sendable {
        /// Intents between consume and outcome at most.
        public var maxInFlight = 10_000
        /// Intents consumed and waiting behind an earlier intent for the same device: they
        /// hold memory but no send slot, so that one busy device cannot stall the others.
        public var maxWaiting = 50_000
        /// Intents waiting behind an earlier one for the same recipient (device or channel) at
        /// most: one that cannot drain (a throttled channel, a device without a rate limit) may
        /// not take the whole of ``maxWaiting``. Past it an intent comes out `failed`
        /// (`RecipientBacklog`) at once.
        public var maxWaitingPerRecipient = 1_000
        /// Offsets of one partition started and not yet committable (behind an unfinished one)
        /// at most; past it the partition pauses until half of them are committable.
        public var maxUncommittedPerPartition = 200_000
        public init() {}
    }

    public struct Defaults: Sendable {
        /// TTL for intents that name no expiration.
        public var expirationSeconds: Int64 = 86_400
        public init() {}
    }

    public struct Retry: Sendable {
        /// First retry delay (ms); doubles per retry, with jitter.
        public var initialBackoffMilliseconds = 200
        public var maxBackoffMilliseconds = 30_000
        /// Give up (outcome `failed`) this long after consuming an intent, if its expiration has
        /// not ended it first.
        public var deadlineSeconds: Int64 = 600
        /// After a credential fault, sends for that team stop this long before one probe.
        public var credentialFaultCooldownSeconds: Int64 = 300
        public init() {}
    }

    public struct RedisSettings: Sendable {
        /// `redis://[[user]:password@]host[:port][/db]` or `rediss://…`; empty: no Redis, and
        /// so no per-device policy (every intent is sent as it comes).
        public var url = ""
        /// `standalone`; `cluster`: `url` names one seed node of a Redis Cluster (database 0),
        /// and calls are routed by hash slot to every master; `sentinel`: `url` names one
        /// Sentinel, and the connections go to the master the Sentinels name.
        public var mode = RedisConfiguration.Mode.standalone
        /// Cluster mode: more seed nodes (`host:port`) besides `url`'s.
        public var clusterSeeds: [RedisNodeAddress] = []
        /// Sentinel mode (`url` names one Sentinel, and the master's credentials and
        /// database): more Sentinels (`host:port`).
        public var sentinels: [RedisNodeAddress] = []
        /// Sentinel mode: the name the Sentinels monitor the master under.
        public var sentinelMaster = "mymaster"
        /// Sentinel mode: the Sentinels' own password; empty when they ask none.
        public var sentinelPassword = ""
        /// While Redis is unreachable: false (default) stops consuming until it is back; true
        /// sends without policy (no dedupe) meanwhile.
        public var failOpen = false
        /// Run even though Redis' `maxmemory-policy` can evict keys (parked intents among
        /// them). Off: the relay refuses to run against such a Redis (see docs/redis.md).
        public var allowEviction = false
        public var connections = 2
        /// Deadline of one Redis call (ms).
        public var timeoutMilliseconds = 1000
        /// Replicas that must have a park (and its due-index entry) before the intent counts as
        /// parked and its offset may be committed (`WAIT`); 0: none asked.
        public var parkMinReplicas = 0
        /// Starts every key the relay writes (and its scripts touch), so that deployments
        /// (staging and production, two tenants) share a Redis or a Redis Cluster without
        /// meeting. Letters, digits and `_ . : / -`, up to 64; the default is the keys' name
        /// before the setting existed. Changing it leaves what the old prefix holds behind
        /// (docs/redis.md: the upgrade path).
        public var keyPrefix = "apns-relay:"
        /// `rediss://`: the certificate authorities (PEM) the server is verified against; empty:
        /// the system's.
        public var tlsCAFile = ""
        /// `rediss://`: a client certificate (PEM, its chain) and its key, for a Redis that asks
        /// for one; both or neither.
        public var tlsCertFile = ""
        public var tlsKeyFile = ""
        public init() {}

        /// The client's settings for ``url`` (which must not be empty).
        public func clientConfiguration() throws -> RedisConfiguration {
            var settings = RedisConfiguration(url: try RedisURL(parsing: url))
            settings.mode = mode
            settings.clusterSeeds = clusterSeeds
            settings.sentinels = sentinels
            settings.sentinelMaster = sentinelMaster
            settings.sentinelPassword = sentinelPassword.isEmpty ? nil : sentinelPassword
            settings.connections = connections
            settings.commandTimeout = .milliseconds(timeoutMilliseconds)
            if !tlsCAFile.isEmpty { settings.tlsCAFile = tlsCAFile }
            if !tlsCertFile.isEmpty { settings.tlsClientCertificate = (tlsCertFile, tlsKeyFile) }
            return settings
        }

        /// What ``keyPrefix`` may be: 1–64 of letters, digits and `_ . : / -`.
        public static func isValidKeyPrefix(_ prefix: String) -> Bool {
            (1...64).contains(prefix.utf8.count) && prefix.utf8.allSatisfy { byte in
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || "_.:/-".utf8.contains(byte)
            }
        }
    }

    public struct HTTP: Sendable {
        /// The address the status endpoints listen on (all interfaces by default: the kubelet's
        /// probes and Prometheus reach the pod's IP).
        public var address = "0.0.0.0"
        public var port = 9464
        /// A connection must deliver a whole request head within this (idle keep-alive
        /// connections and slow-loris requests are closed).
        public var requestTimeoutSeconds = 10
        /// Connections open at once; more are closed as they arrive.
        public var maxConnections = 4096
        public init() {}
    }

    /// Spans of traced intents (see docs/operations.md, "Tracing").
    public struct Tracing: Sendable {
        /// The OTLP/HTTP collector, `http(s)://HOST:PORT[/PREFIX]` (spans go to
        /// `PREFIX/v1/traces`); empty: no spans (trace context is still carried from intent to
        /// outcome).
        public var otlpEndpoint = ""
        /// How spans are encoded: `http/protobuf` (OTLP's default; ``OTLPProtocol`` says why
        /// `http/json` is not offered).
        public var otlpProtocol = OTLPProtocol.httpProtobuf
        public init() {}
    }

    public var kafka = Kafka()
    public var apns = APNsSettings()
    public var limits = Limits()
    public var defaults = Defaults()
    public var retry = Retry()
    public var redis = RedisSettings()
    /// The rules applied in Redis per device, and per broadcast channel (docs/redis.md).
    public typealias Policy = PolicyConfiguration
    public var policy = Policy()
    public var http = HTTP()
    public var tracing = Tracing()
    /// Seconds SIGTERM waits for in-flight intents before giving up on them (uncommitted).
    public var shutdownDeadlineSeconds = 20

    public init() {}
}

/// Finds the credentials for a topic: one that names it, else a token credential naming its
/// bundle id (the topic without a push type's suffix: a key sends every push type of its apps).
/// A certificate covers exactly the topics it names (APNs refuses the others, TopicDisallowed).
struct CredentialDirectory: Sendable {
    private let byTopic: [String: Int]
    private let byBundleID: [String: Int]

    /// - Parameters:
    ///   - topics: each credential's topics, in `apns.credentials` order (a certificate
    ///     credential's own when the file lists none).
    ///   - exact: per credential, whether it covers its topics only (certificates).
    init(topics: [[String]], exact: [Bool] = []) {
        var byTopic: [String: Int] = [:], byBundleID: [String: Int] = [:]
        for (index, list) in topics.enumerated() {
            for topic in list where byTopic[topic] == nil { byTopic[topic] = index }
            if index < exact.count, exact[index] { continue }
            for topic in list where byBundleID[topic] == nil { byBundleID[topic] = index }
        }
        self.byTopic = byTopic
        self.byBundleID = byBundleID
    }

    func index(forTopic topic: String) -> Int? {
        if let direct = byTopic[topic] { return direct }
        for pushType in PushType.allCases where !pushType.topicSuffix.isEmpty && topic.hasSuffix(pushType.topicSuffix) {
            if let found = byBundleID[String(topic.dropLast(pushType.topicSuffix.count))] { return found }
        }
        return nil
    }
}
