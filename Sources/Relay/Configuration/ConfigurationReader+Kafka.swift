extension ConfigurationReader {
    /// The `kafka` section: brokers, group, the intents topic or lanes, the outcomes and
    /// invalidations topics, librdkafka settings.
    mutating func readKafka(_ kafka: [String: Any], into configuration: inout RelayConfiguration) {
        checkKnown(kafka, prefix: "kafka.", known: Set(RelayConfiguration.Kafka.propertySections).union(["brokers", "group_id", "intents_topic", "lanes", "outcomes_topic", "invalidations_topic",
                                                    "allow_unsafe_config",
                                                    "unready_after_unreachable_seconds"]))
        configuration.kafka.brokers = string(kafka, "kafka.brokers", default: configuration.kafka.brokers, nonEmpty: true)
        configuration.kafka.groupID = string(kafka, "kafka.group_id", default: configuration.kafka.groupID, nonEmpty: true)
        configuration.kafka.intentsTopic = string(kafka, "kafka.intents_topic", default: configuration.kafka.intentsTopic, nonEmpty: true)
        if let lanes = kafka["lanes"] {
            if kafka["intents_topic"] != nil || override("kafka.intents_topic") != nil {
                issues.append(.init(key: "kafka.intents_topic", value: "\"\(configuration.kafka.intentsTopic)\"",
                                    allowed: "left out when kafka.lanes is set (the lanes name the intents topics)"))
            }
            readLanes(lanes, into: &configuration)
        }
        configuration.kafka.outcomesTopic = string(kafka, "kafka.outcomes_topic", default: configuration.kafka.outcomesTopic, nonEmpty: true)
        configuration.kafka.invalidationsTopic = string(kafka, "kafka.invalidations_topic", default: "")
        let intentTopics = configuration.kafka.intentTopics
        if intentTopics.contains(configuration.kafka.outcomesTopic) {
            issues.append(.init(key: "kafka.outcomes_topic", value: configuration.kafka.outcomesTopic,
                                allowed: "a topic other than the intents topics (kafka.intents_topic, kafka.lanes)"))
        }
        if (intentTopics + [configuration.kafka.outcomesTopic]).contains(configuration.kafka.invalidationsTopic) {
            issues.append(.init(key: "kafka.invalidations_topic", value: configuration.kafka.invalidationsTopic,
                                allowed: "empty (off), or a topic of its own (not an intents topic or kafka.outcomes_topic)"))
        }
        let sections = RelayConfiguration.Kafka.propertySections.map { readProperties(kafka, $0) }
        (configuration.kafka.properties, configuration.kafka.consumerProperties, configuration.kafka.producerProperties) =
            (sections[0], sections[1], sections[2])
        configuration.kafka.allowUnsafeConfig = bool(kafka, "kafka.allow_unsafe_config", default: false)
        configuration.kafka.unreadyAfterUnreachableSeconds = integer(kafka, "kafka.unready_after_unreachable_seconds",
                                                                     default: 60, range: 1...3600)
        if !configuration.kafka.allowUnsafeConfig {
            for (section, properties) in zip(RelayConfiguration.Kafka.propertySections, sections) {
                for (name, value) in properties.sorted(by: { $0.key < $1.key }) {
                    if let allowed = RelayConfiguration.Kafka.guaranteeBreaking(name, value) {
                        issues.append(.init(key: "kafka.\(section).\(name)", value: value,
                                            allowed: "\(allowed) (or kafka.allow_unsafe_config: true)"))
                    }
                }
            }
        }
    }

    /// A map of librdkafka settings, `kafka.<section>`, with those from the environment over it
    /// (secrets from a Kubernetes Secret, say): `APNS_RELAY_KAFKA_CONFIG_SASL_PASSWORD` sets
    /// `kafka.config`'s `sasl.password`, `APNS_RELAY_KAFKA_CONSUMER_CONFIG_…` the consumer's.
    private mutating func readProperties(_ kafka: [String: Any], _ section: String) -> [String: String] {
        var properties: [String: String] = [:]
        if let given = mapping(kafka[section], key: "kafka.\(section)") {
            for (name, value) in given {
                guard let text = scalarText(value) else {
                    issues.append(.init(key: "kafka.\(section).\(name)", value: describe(value), allowed: "librdkafka settings are scalars"))
                    continue
                }
                properties[name] = text
            }
        }
        let prefix = RelayConfiguration.environmentName(forKey: "kafka.\(section)") + "_"
        for (variable, value) in environment where variable.hasPrefix(prefix) && variable.count > prefix.count {
            properties[variable.dropFirst(prefix.count).lowercased().replacingOccurrences(of: "_", with: ".")] = value
        }
        return properties
    }

    /// `kafka.lanes`: a non-empty list of `{topic, weight}`, each topic once, weights 1–1000.
    /// The first lane's topic becomes ``RelayConfiguration/Kafka/intentsTopic``.
    private mutating func readLanes(_ value: Any, into configuration: inout RelayConfiguration) {
        guard let items = value as? [Any], !items.isEmpty else {
            issues.append(.init(key: "kafka.lanes", value: describe(value), allowed: "a non-empty list of {topic, weight}"))
            return
        }
        var seen: Set<String> = []
        for (index, item) in items.enumerated() {
            let key = "kafka.lanes[\(index)]"
            guard let fields = mapping(item, key: key) else { continue }
            checkKnown(fields, prefix: key + ".", known: ["topic", "weight"])
            let topic = string(fields, key + ".topic", default: "", nonEmpty: true, overridable: false)
            let weight = integer(fields, key + ".weight", default: 1, range: 1...1000, overridable: false)
            guard !topic.isEmpty else { continue }
            guard seen.insert(topic).inserted else {
                issues.append(.init(key: key + ".topic", value: topic, allowed: "each lane's topic differs from the others'"))
                continue
            }
            configuration.kafka.lanes.append(.init(topic: topic, weight: weight))
        }
        if let first = configuration.kafka.lanes.first { configuration.kafka.intentsTopic = first.topic }
    }
}
