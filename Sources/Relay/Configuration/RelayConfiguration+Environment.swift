import Foundation

/// The environment's part in a configuration: the `APNS_RELAY_` variables that override keys,
/// and the ones that name nothing the relay reads.
extension RelayConfiguration {
    /// Environment variables override scalar keys: `APNS_RELAY_` and the key's path in upper
    /// case with dots as underscores, e.g. `APNS_RELAY_KAFKA_BROKERS`,
    /// `APNS_RELAY_LIMITS_MAX_IN_FLIGHT`.
    public static let environmentPrefix = "APNS_RELAY_"

    public static func environmentName(forKey key: String) -> String {
        environmentPrefix + key.uppercased().replacingOccurrences(of: ".", with: "_")
    }

    /// Variables the relay reads besides the configuration keys' (`APNS_RELAY_` + a key path):
    /// the log level and format, a PKCS#12 passphrase for `send` and `bench`, and the build's and
    /// the test suite's own.
    public static let otherEnvironmentVariables: Set<String> = [
        "APNS_RELAY_LOG_LEVEL", "APNS_RELAY_LOG_FORMAT", "APNS_RELAY_CERT_PASSPHRASE", "APNS_RELAY_COMMIT",
        "APNS_RELAY_NO_BENCHMARKS", "APNS_RELAY_TEST_SLOWDOWN", "APNS_RELAY_FULL_OUTPUT", "APNS_RELAY_FUZZ", "APNS_RELAY_FUZZ_TARGET",
    ]

    /// The `APNS_RELAY_` variables of `environment` that name nothing the relay reads: a typo
    /// (`APNS_RELAY_KAFKA_BROKER`) would otherwise leave the setting at its default without a
    /// word. Librdkafka settings (`APNS_RELAY_KAFKA_CONFIG_…`, `…_CONSUMER_CONFIG_…`,
    /// `…_PRODUCER_CONFIG_…`) and the variables `passphrase_env` names are read as they are.
    /// Sorted; only names, never values.
    public static func unknownEnvironmentVariables(_ environment: [String: String], passphraseVariables: Set<String> = []) -> [String] {
        var reader = ConfigurationReader(root: [String: Any](), environment: [:])
        _ = reader.read()
        let known = Set(reader.knownKeys.map(environmentName(forKey:))).union(otherEnvironmentVariables).union(passphraseVariables)
        let passedOn = Kafka.propertySections.map { environmentName(forKey: "kafka.\($0)") + "_" }
        return environment.keys.filter { name in
            name.hasPrefix(environmentPrefix) && !known.contains(name) && !passedOn.contains { name.hasPrefix($0) }
        }.sorted()
    }
}
