import Foundation
public import Kafka
import Common

/// What the invalidations topic says now: the (topic, token) pairs currently known dead, as a
/// compacted topic keeps them (the last record per key wins; a tombstone removes the key).
/// Read with ``read(from:timeout:)``, which the `apns-relay invalidations` command prints.
public struct InvalidationTopic: Sendable {
    /// The last record per key, its value as published.
    private var dead: [[UInt8]: [UInt8]] = [:]

    public init() {}

    /// Takes one record read from the topic, in its partition's order.
    public mutating func apply(_ message: KafkaMessage) {
        guard let key = message.key else { return }
        if message.hasNullValue {
            dead[key] = nil
        } else {
            dead[key] = message.value
        }
    }

    /// The dead pairs' records (as published: ``Invalidation``'s JSON), in key order; with
    /// `since`, only those the relay published at or after it (their `at`, ms since the epoch).
    public func records(since: Int64? = nil) -> [[UInt8]] {
        dead.sorted { $0.key.lexicographicallyPrecedes($1.key) }.compactMap { _, value in
            guard let since else { return value }
            let object = try? JSONSerialization.jsonObject(with: Data(value)) as? [String: Any]
            guard let at = (object?["at"] as? NSNumber)?.int64Value else { return nil }
            return at >= since ? value : nil
        }
    }

    public var count: Int { dead.count }

    /// Reads the whole topic as it is now (up to every partition's end when the read starts),
    /// without joining a consumer group; keeps only the current dead pairs, not every record.
    public static func read(bootstrapServers: String, topic: String, properties: [String: String] = [:],
                            timeout: Duration) async throws(KafkaError) -> InvalidationTopic {
        let reader = try KafkaTopicReader(bootstrapServers: bootstrapServers, topic: topic, properties: properties)
        let state = Locked(InvalidationTopic())
        do {
            try await reader.readToEnd(timeout: timeout) { batch in
                state.withLock { topic in for message in batch { topic.apply(message) } }
            }
        } catch {
            await reader.close()
            throw error
        }
        await reader.close()
        return state.withLock { $0 }
    }
}
