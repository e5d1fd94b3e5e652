import Relay
import Testing

/// `kafka.lanes`: what it accepts, what it refuses, and how it round-trips.
@Suite("Lane configuration", .timeLimit(.minutes(1)))
struct LaneConfigurationTests {
    static let lanes = """
    kafka:
      lanes:
        - {topic: apns.intents.urgent, weight: 8}
        - {topic: apns.intents, weight: 2}
        - {topic: apns.intents.bulk, weight: 1}
    """

    @Test func lanesAreReadInOrderAndTheFirstNamesTheIntentsTopic() throws {
        let configuration = try RelayConfiguration.load(yaml: Self.lanes)
        #expect(configuration.kafka.intentLanes.map(\.topic) == ["apns.intents.urgent", "apns.intents", "apns.intents.bulk"])
        #expect(configuration.kafka.intentLanes.map(\.weight) == [8, 2, 1])
        #expect(configuration.kafka.intentsTopic == "apns.intents.urgent")
        // The effective configuration reads back as the same lanes (and no intents_topic).
        let again = try RelayConfiguration.load(yaml: configuration.redactedYAML)
        #expect(again.kafka.intentLanes == configuration.kafka.intentLanes)
        #expect(!configuration.redactedYAML.contains("intents_topic"))
    }

    @Test func withoutLanesTheIntentsTopicIsTheOneLane() throws {
        let configuration = try RelayConfiguration.load(yaml: "kafka:\n  intents_topic: in\n")
        #expect(configuration.kafka.intentLanes == [.init(topic: "in", weight: 1)])
        #expect(configuration.kafka.lanes.isEmpty)
    }

    @Test(arguments: [
        // Both at once.
        ("kafka:\n  intents_topic: x\n  lanes: [{topic: a, weight: 1}]\n", "kafka.intents_topic", "left out when kafka.lanes is set"),
        // A topic twice.
        ("kafka:\n  lanes: [{topic: a, weight: 1}, {topic: a, weight: 2}]\n", "kafka.lanes[1].topic", "differs from the others"),
        // Weights below 1, or not numbers.
        ("kafka:\n  lanes: [{topic: a, weight: 0}]\n", "kafka.lanes[0].weight", "1...1000"),
        ("kafka:\n  lanes: [{topic: a, weight: -3}]\n", "kafka.lanes[0].weight", "1...1000"),
        ("kafka:\n  lanes: [{topic: a, weight: heavy}]\n", "kafka.lanes[0].weight", "whole number"),
        // No topic, an unknown key, not a list, an empty list.
        ("kafka:\n  lanes: [{weight: 1}]\n", "kafka.lanes[0].topic", "must not be empty"),
        ("kafka:\n  lanes: [{topic: a, weight: 1, colour: red}]\n", "kafka.lanes[0].colour", "unknown key"),
        ("kafka:\n  lanes: apns.intents\n", "kafka.lanes", "a non-empty list"),
        ("kafka:\n  lanes: []\n", "kafka.lanes", "a non-empty list"),
        ("kafka:\n  lanes: [a]\n", "kafka.lanes[0]", "mapping"),
        // The outcomes or invalidations topic is a lane.
        ("kafka:\n  outcomes_topic: a\n  lanes: [{topic: a, weight: 1}]\n", "kafka.outcomes_topic", "other than the intents topics"),
        ("kafka:\n  invalidations_topic: b\n  lanes: [{topic: a, weight: 1}, {topic: b, weight: 1}]\n", "kafka.invalidations_topic", "not an intents topic"),
    ])
    func badLanesAreRefused(yaml: String, key: String, allowed: String) throws {
        let error = try #require(throws: ConfigurationError.self) { try RelayConfiguration.load(yaml: yaml) }
        #expect(error.issues.contains { $0.key == key && $0.allowed.contains(allowed) }, "\(error.issues)")
    }

    @Test func theIntentsTopicOverrideAlsoConflictsWithLanes() throws {
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "kafka:\n  lanes: [{topic: a, weight: 1}]\n",
                                        environment: [RelayConfiguration.environmentName(forKey: "kafka.intents_topic"): "b"])
        }
        #expect(error.issues.map(\.key) == ["kafka.intents_topic"], "\(error.issues)")
    }
}
