import Foundation
import Kafka
import Common
import Testing
import TestSupport

/// Every outcome an outcomes topic holds, read to its end (its high watermarks) once a run
/// settled — no early stop at a count — each checked against `docs/outcome.schema.json`.
struct OutcomeLog {
    /// The outcomes as published, in the order read (per partition, in order).
    let outcomes: [[String: Any]]
    /// Outcomes per intent, keyed by the intent's lane (intents topic), partition and offset.
    let byIntent: [IntentPosition: Int]

    struct IntentPosition: Hashable, CustomStringConvertible {
        var lane = ""
        let partition: Int
        let offset: Int
        var description: String { "\(lane)[\(partition)]@\(offset)" }
    }

    private static let schema = Result { try JSONSchemaCheck(docs: "outcome.schema.json") }

    /// Reads the topic to its end (a minute, stretched under a sanitizer); records an issue for
    /// every outcome the schema refuses.
    static func read(_ bootstrapServers: String, _ topic: String, timeout: Duration = slowed(.seconds(60)),
                     sourceLocation: SourceLocation = #_sourceLocation) async throws -> OutcomeLog {
        let messages = try await withTopicReader(bootstrapServers, topic) { try await $0.readToEnd(timeout: timeout) }
        let schema = try schema.get()
        var outcomes: [[String: Any]] = []
        var byIntent: [IntentPosition: Int] = [:]
        for message in messages {
            let text = String(decoding: message.value, as: UTF8.self)
            let problems = (try? schema.problems(JSONValue(parsing: message.value))) ?? ["not JSON"]
            #expect(problems.isEmpty, "outcome \(text): \(problems.joined(separator: "; "))", sourceLocation: sourceLocation)
            let outcome = try #require(try JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any],
                                       sourceLocation: sourceLocation)
            outcomes.append(outcome)
            if let position = position(of: outcome) { byIntent[position, default: 0] += 1 }
        }
        return OutcomeLog(outcomes: outcomes, byIntent: byIntent)
    }

    /// Where an outcome's intent was.
    static func position(of outcome: [String: Any]) -> IntentPosition? {
        guard let partition = outcome["partition"] as? Int, let offset = outcome["offset"] as? Int else { return nil }
        return IntentPosition(lane: outcome["lane"] as? String ?? "", partition: partition, offset: offset)
    }

    /// Outcomes beyond the first for any intent (a replay after a crash repeats some).
    var repeats: Int { byIntent.values.reduce(0) { $0 + $1 - 1 } }

    /// Expects exactly one outcome for every intent in `intents` (partition → how many records
    /// the intents topic holds), none for anything else, and no intent answered twice —
    /// `unanswered` of them may have none (parked, or cut off by a shutdown).
    ///
    /// - Parameter repeatedOnlyAs: allows an intent's outcomes after its first when they have
    ///   this status (a Redis failover's lost writes can answer an intent again, `duplicate`).
    func expectOneEach(of intents: [Int: Int], unanswered: Int = 0, repeatedOnlyAs allowed: String? = nil,
                       sourceLocation: SourceLocation = #_sourceLocation) {
        // One intents topic: the lane every outcome names.
        let lane = byIntent.keys.first?.lane ?? ""
        expectOneEach(ofLanes: [lane: intents], unanswered: unanswered, repeatedOnlyAs: allowed, sourceLocation: sourceLocation)
    }

    /// ``expectOneEach(of:unanswered:repeatedOnlyAs:sourceLocation:)`` over several intents
    /// topics (lane → partition → records).
    func expectOneEach(ofLanes lanes: [String: [Int: Int]], unanswered: Int = 0, repeatedOnlyAs allowed: String? = nil,
                       sourceLocation: SourceLocation = #_sourceLocation) {
        let twice = byIntent.filter { $0.value > 1 }.keys.sorted { ($0.partition, $0.offset) < ($1.partition, $1.offset) }.filter { position in
            guard let allowed else { return true }
            let answers = outcomes.filter { Self.position(of: $0) == position }
            return !answers.dropFirst().allSatisfy { $0["status"] as? String == allowed }
        }
        let repeated = twice.map { position in
            "\(position): " + outcomes.filter { Self.position(of: $0) == position }
                .map { "\($0["id"] ?? "-") \($0["status"] ?? "-") \($0["reason"] ?? "-") by \($0["worker"] ?? "-")" }.joined(separator: ", ")
        }
        #expect(twice.isEmpty, "intents answered more than once: \(repeated)", sourceLocation: sourceLocation)
        let expected = Set(lanes.flatMap { lane, intents in
            intents.flatMap { partition, count in (0..<count).map { IntentPosition(lane: lane, partition: partition, offset: $0) } }
        })
        let stray = Set(byIntent.keys).subtracting(expected)
        #expect(stray.isEmpty, "outcomes for no intent on the topic: \(stray)", sourceLocation: sourceLocation)
        let missing = expected.subtracting(byIntent.keys).count
        #expect(missing == unanswered, "\(missing) intents without an outcome, expected \(unanswered)", sourceLocation: sourceLocation)
    }
}

/// Reads an outcomes topic until `count` distinct intent ids were answered (a repeated outcome
/// does not count twice); every outcome read, as published.
func readOutcomes(_ bootstrapServers: String, _ topic: String, distinct count: Int,
                  timeout: Duration = .seconds(90)) async throws -> [KafkaMessage] {
    let ids = Locked(Set<String>())
    return try await readTopic(bootstrapServers, topic, timeout: timeout) { batch, _ in
        ids.withLock { ids in
            for message in batch {
                if let object = try? JSONSerialization.jsonObject(with: Data(message.value)) as? [String: Any],
                   let id = object["id"] as? String {
                    ids.insert(id)
                }
            }
            return ids.count >= count
        }
    }
}

extension RelayHarness {
    /// Reads outcomes until `count` distinct intents were answered (or `timeout` passed).
    func outcomes(distinct count: Int, timeout: Duration = .seconds(90)) async throws -> [[String: Any]] {
        try await readOutcomes(cluster.bootstrapServers, outcomesTopic, distinct: count, timeout: timeout).map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.value)) as? [String: Any])
        }
    }
}

/// How many records each partition of a topic holds (its end offsets; the topics here are
/// written without transactions, so every offset is a record).
func recordsPerPartition(_ bootstrapServers: String, _ topic: String) async throws -> [Int: Int] {
    let ends = try await withTopicReader(bootstrapServers, topic) { try await $0.ends(timeout: .seconds(20)) }
    return Dictionary(uniqueKeysWithValues: ends.map { (Int($0.key), Int($0.value)) })
}

/// A reader of `topic` for `body`, closed after it whether it threw or not.
func withTopicReader<T>(_ bootstrapServers: String, _ topic: String,
                        _ body: (KafkaTopicReader) async throws -> T) async throws -> T {
    let reader = try KafkaTopicReader(bootstrapServers: bootstrapServers, topic: topic)
    do {
        let result = try await body(reader)
        await reader.close()
        return result
    } catch {
        await reader.close()
        throw error
    }
}

extension ProcessHarness {
    /// Every outcome on the outcomes topic, read to its end, each checked against the schema.
    func outcomeLog(sourceLocation: SourceLocation = #_sourceLocation) async throws -> OutcomeLog {
        try await OutcomeLog.read(cluster.bootstrapServers, outcomesTopic, sourceLocation: sourceLocation)
    }

    /// How many intents each partition of the intents topic holds.
    func intentsPerPartition() async throws -> [Int: Int] {
        try await recordsPerPartition(cluster.bootstrapServers, intentsTopic)
    }
}

extension RelayHarness {
    /// How many intents each partition of the intents topic holds.
    func intentsPerPartition() async throws -> [Int: Int] {
        try await recordsPerPartition(cluster.bootstrapServers, intentsTopic)
    }

    /// Stops the relay, then reads the outcomes topic to its end and expects exactly one outcome,
    /// valid by the schema, for every intent on the intents topic (`unanswered` of them may have
    /// none), and as many outcomes as the relay counted as published. Returns them.
    @discardableResult
    func stopExpectingOneOutcomeEach(unanswered: Int = 0,
                                     sourceLocation: SourceLocation = #_sourceLocation) async throws -> [[String: Any]] {
        let published = await stopCountingOutcomes()
        let log = try await OutcomeLog.read(cluster.bootstrapServers, outcomesTopic, sourceLocation: sourceLocation)
        log.expectOneEach(of: try await intentsPerPartition(), unanswered: unanswered, sourceLocation: sourceLocation)
        #expect(log.outcomes.count == published, "the topic holds \(log.outcomes.count) outcomes, the relay published \(published)",
                sourceLocation: sourceLocation)
        return log.outcomes
    }
}
