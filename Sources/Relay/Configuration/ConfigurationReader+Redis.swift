import Common
import Redis

extension ConfigurationReader {
    /// The `redis` section: where Redis is (standalone, a Redis Cluster's seeds, or Sentinels),
    /// how the relay uses it, its keys' prefix and TLS files.
    mutating func readRedis(_ redis: [String: Any], into configuration: inout RelayConfiguration) {
        checkKnown(redis, prefix: "redis.", known: ["url", "mode", "cluster_seeds", "sentinels", "sentinel_master", "sentinel_password",
                                                          "fail_open", "allow_eviction", "connections", "timeout_ms",
                                                          "park_min_replicas", "key_prefix", "tls_ca_file", "tls_cert_file", "tls_key_file"])
        configuration.redis.url = string(redis, "redis.url", default: "")
        let mode = string(redis, "redis.mode", default: RedisConfiguration.Mode.standalone.rawValue)
        if let known = RedisConfiguration.Mode(rawValue: mode) {
            configuration.redis.mode = known
        } else {
            issues.append(.init(key: "redis.mode", value: describe(mode), allowed: "standalone, cluster or sentinel"))
        }
        configuration.redis.clusterSeeds = readAddresses(redis["cluster_seeds"], key: "redis.cluster_seeds", for: .cluster,
                                                         mode: configuration.redis.mode)
        configuration.redis.sentinels = readAddresses(redis["sentinels"], key: "redis.sentinels", for: .sentinel,
                                                      mode: configuration.redis.mode)
        configuration.redis.sentinelMaster = string(redis, "redis.sentinel_master", default: "mymaster")
        if configuration.redis.sentinelMaster.isEmpty
            || !configuration.redis.sentinelMaster.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) {
            issues.append(.init(key: "redis.sentinel_master", value: describe(configuration.redis.sentinelMaster),
                                allowed: "the name the Sentinels monitor the master under (printable ASCII, no spaces)"))
        }
        configuration.redis.sentinelPassword = string(redis, "redis.sentinel_password", default: "")
        if !configuration.redis.url.isEmpty {
            do {
                let url = try RedisURL(parsing: configuration.redis.url)
                if configuration.redis.mode == .cluster, url.database != 0 {
                    issues.append(.init(key: "redis.url", value: url.description,
                                        allowed: "a Redis Cluster has database 0 only: end the URL with /0 or no database"))
                }
            } catch {
                // The value may hold a password: show it redacted.
                let shown = URLCredentials.redacted(configuration.redis.url)
                issues.append(.init(key: "redis.url", value: shown, allowed: "\(error); use redis://[[user]:password@]host[:port][/db] or rediss://, or leave it empty for no Redis"))
            }
        }
        if configuration.redis.mode == .cluster, configuration.redis.url.isEmpty {
            issues.append(.init(key: "redis.url", value: "\"\"", allowed: "redis.mode cluster needs a seed node's URL here"))
        }
        if configuration.redis.mode == .sentinel, configuration.redis.url.isEmpty {
            issues.append(.init(key: "redis.url", value: "\"\"",
                                allowed: "redis.mode sentinel needs one Sentinel's address here, with the master's credentials and database"))
        }
        configuration.redis.failOpen = bool(redis, "redis.fail_open", default: false)
        configuration.redis.allowEviction = bool(redis, "redis.allow_eviction", default: false)
        configuration.redis.connections = integer(redis, "redis.connections", default: 2, range: 1...32)
        configuration.redis.timeoutMilliseconds = integer(redis, "redis.timeout_ms", default: 1000, range: 10...60_000)
        configuration.redis.parkMinReplicas = integer(redis, "redis.park_min_replicas", default: 0, range: 0...16)
        configuration.redis.keyPrefix = string(redis, "redis.key_prefix", default: "apns-relay:")
        if !RelayConfiguration.RedisSettings.isValidKeyPrefix(configuration.redis.keyPrefix) {
            issues.append(.init(key: "redis.key_prefix", value: describe(configuration.redis.keyPrefix),
                                allowed: "1-64 characters of letters, digits and _ . : / - (no braces: they would move the keys' hash tags)"))
        }
        configuration.redis.tlsCAFile = string(redis, "redis.tls_ca_file", default: "")
        configuration.redis.tlsCertFile = string(redis, "redis.tls_cert_file", default: "")
        configuration.redis.tlsKeyFile = string(redis, "redis.tls_key_file", default: "")
        if configuration.redis.tlsCertFile.isEmpty != configuration.redis.tlsKeyFile.isEmpty {
            issues.append(.init(key: configuration.redis.tlsCertFile.isEmpty ? "redis.tls_cert_file" : "redis.tls_key_file", value: "\"\"",
                                allowed: "a client certificate needs both redis.tls_cert_file and redis.tls_key_file"))
        }
        let tlsFiles = [configuration.redis.tlsCAFile, configuration.redis.tlsCertFile, configuration.redis.tlsKeyFile]
        if tlsFiles.contains(where: { !$0.isEmpty }), !((try? RedisURL(parsing: configuration.redis.url))?.tls ?? false) {
            issues.append(.init(key: "redis.url", value: (try? RedisURL(parsing: configuration.redis.url))?.description ?? "\"\"",
                                allowed: "redis.tls_* files are for a rediss:// URL"))
        }
    }

    /// `redis.cluster_seeds` or `redis.sentinels`: `host:port` each, for `redis.mode` `only`.
    private mutating func readAddresses(_ value: Any?, key: String, for only: RedisConfiguration.Mode,
                                        mode: RedisConfiguration.Mode) -> [RedisNodeAddress] {
        var addresses: [RedisNodeAddress] = []
        for text in stringList(value, key: key) {
            guard let address = try? RedisNodeAddress(parsing: text) else {
                issues.append(.init(key: key, value: text, allowed: "each entry is host:port (port 1-65535)"))
                continue
            }
            addresses.append(address)
        }
        if !addresses.isEmpty, mode != only {
            issues.append(.init(key: key, value: "(a list)", allowed: "only for redis.mode: \(only.rawValue)"))
        }
        return addresses
    }
}
