import Common
import CRdKafka
import Foundation
public import Logging

/// Reads one topic from its start without joining a consumer group: every partition is assigned
/// by hand, so there is no group join (the few seconds a subscription waits for its first
/// assignment), no rebalance and no commit. For reading what a topic holds — up to its end as it
/// is now, or until enough arrived — not for consuming it as a worker does.
///
/// Reads continue where the previous one stopped, one at a time (a second waits for the first).
/// Each read polls on a thread of its own, never on the caller's executor, and gives up at its
/// deadline.
public final class KafkaTopicReader: Sendable {
    public let topic: String
    private let handle: KafkaHandle
    /// The partitions (from the topic's metadata) and the next offset of each, once assigned.
    private let state = Locked<State?>(nil)
    /// Held for a whole read: reads share the assignment and the positions.
    private let reading = Locked(())
    /// Where reads start: nil, every partition's start; else each partition's first record
    /// stamped at or after it (ms since the epoch; the broker's time index answers).
    private let since: Int64?

    private struct State {
        var next: [Int32: Int64]
        var lastError: String?
    }

    /// What a timed-out read says about where it stood.
    private var progress: String {
        state.withLock { state in
            guard let state else { return "no partitions assigned" }
            let positions = state.next.sorted { $0.key < $1.key }.map { "[\($0.key)]@\($0.value)" }.joined(separator: " ")
            return "next offsets \(positions)" + (state.lastError.map { ", last error: \($0)" } ?? "")
        }
    }

    /// Only configures the client; the first read asks for the topic's partitions.
    /// - Parameter properties: passed to librdkafka as they are, after the defaults (so they win).
    /// - Parameter since: read from each partition's first record stamped at or after this time
    ///   (ms since the epoch), not from its start.
    public init(bootstrapServers: String, topic: String, properties: [String: String] = [:], since: Int64? = nil,
                logger: Logger = Logger(label: "apns-relay.kafka.reader")) throws(KafkaError) {
        self.since = since
        var settings: [String: String] = [
            "bootstrap.servers": bootstrapServers,
            // librdkafka's consumer needs a group id even when it never joins the group.
            "group.id": "apns-relay-reader-\(UUID().uuidString)",
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "false",
            // An offset the topic no longer has (retention, compaction) reads on from the
            // oldest it has, never silently from its end.
            "auto.offset.reset": "earliest",
        ]
        settings.merge(properties) { _, given in given }
        // What reading as a reader needs, whatever the consumer's settings passed say.
        for key in ["enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof"] { settings[key] = "false" }
        settings["auto.offset.reset"] = "earliest"
        let builder = try KafkaConfigBuilder(settings)
        let context = KafkaCallbackContext(logger: logger)
        context.install(on: builder)
        handle = try KafkaHandle(type: RD_KAFKA_CONSUMER, configuration: builder, context: context)
        handle.withHandle { _ = rd_kafka_poll_set_consumer($0) }
        self.topic = topic
    }

    /// Reads until `enough` (called with each new batch and the number of records this read
    /// returned so far) says so. Throws a timed-out ``KafkaError`` after `timeout`.
    public func read(timeout: Duration,
                     until enough: @escaping @Sendable (_ batch: [KafkaMessage], _ total: Int) -> Bool) async throws(KafkaError) -> [KafkaMessage] {
        let deadline = ContinuousClock.now + timeout
        return try await runBlocking { [self] in
            Result { () throws(KafkaError) -> [KafkaMessage] in try reading.withLock { _ throws(KafkaError) in
                try assignIfNeeded(deadline: deadline)
                var messages: [KafkaMessage] = []
                while true {
                    let batch = try poll(deadline: deadline)
                    messages += batch
                    if !batch.isEmpty, enough(batch, messages.count) { return messages }
                    if ContinuousClock.now >= deadline {
                        throw KafkaError(code: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue,
                                         message: "read \(topic): \(messages.count) records in \(timeout), not enough; \(progress)", isRetriable: true)
                    }
                }
            } }
        }.get()
    }

    /// Reads up to the end of every partition as it is when the call starts (its high
    /// watermarks). Throws a timed-out ``KafkaError`` if that takes longer than `timeout`.
    public func readToEnd(timeout: Duration) async throws(KafkaError) -> [KafkaMessage] {
        let collected = Locked<[KafkaMessage]>([])
        try await readToEnd(timeout: timeout) { batch in collected.withLock { $0 += batch } }
        return collected.withLock { $0 }
    }

    /// ``readToEnd(timeout:)`` one batch at a time: `each` gets every batch as it is read (on the
    /// reading thread), and nothing is kept here, so a topic of any size is read in bounded
    /// memory.
    public func readToEnd(timeout: Duration, each: @escaping @Sendable (_ batch: [KafkaMessage]) -> Void) async throws(KafkaError) {
        let deadline = ContinuousClock.now + timeout
        try await runBlocking { [self] in
            Result { () throws(KafkaError) in try reading.withLock { _ throws(KafkaError) in
                let ends = try endOffsets(deadline: deadline)
                var count = 0
                while !reached(ends) {
                    guard ContinuousClock.now < deadline else {
                        throw KafkaError(code: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue,
                                         message: "read \(topic) to its end: \(count) records in \(timeout), short of \(ends); \(progress)",
                                         isRetriable: true)
                    }
                    let batch = try poll(deadline: deadline)
                    count += batch.count
                    if !batch.isEmpty { each(batch) }
                }
            } }
        }.get()
    }

    /// Where every partition of the topic ends now (its high watermark: the offset the next
    /// record will get, so the number of records it ever held).
    public func ends(timeout: Duration) async throws(KafkaError) -> [Int32: Int64] {
        let deadline = ContinuousClock.now + timeout
        return try await runBlocking { [self] in
            Result { () throws(KafkaError) -> [Int32: Int64] in try reading.withLock { _ throws(KafkaError) in
                try endOffsets(deadline: deadline)
            } }
        }.get()
    }

    private func endOffsets(deadline: ContinuousClock.Instant) throws(KafkaError) -> [Int32: Int64] {
        try assignIfNeeded(deadline: deadline)
        let partitions = state.withLock { $0?.next.keys.sorted() ?? [] }
        var ends: [Int32: Int64] = [:]
        try handle.withHandle { rk throws(KafkaError) in
            for partition in partitions {
                var low: Int64 = 0, high: Int64 = 0
                let error = rd_kafka_query_watermark_offsets(rk, topic, partition, &low, &high, remainingMilliseconds(deadline))
                guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "watermarks of \(topic) [\(partition)]") }
                ends[partition] = high
            }
        }
        return ends
    }

    /// Whether every partition's next offset (or librdkafka's position, which also moves past
    /// records a reader never sees, such as transaction markers) reached its end.
    private func reached(_ ends: [Int32: Int64]) -> Bool {
        let partitions = ends.keys.sorted()
        let positions: [Int64] = handle.withHandle { rk in
            withPartitionList(partitions.map { TopicPartition(topic: topic, partition: $0) }) { list in
                _ = rd_kafka_position(rk, list)
                return (0..<Int(list.pointee.cnt)).map { list.pointee.elems[$0].offset }
            }
        }
        let next = state.withLock { $0?.next ?? [:] }
        return zip(partitions, positions).allSatisfy { partition, position in
            max(next[partition] ?? 0, position) >= ends[partition]!
        }
    }

    /// Asks for the topic's partitions and assigns all of them from their start (or from
    /// ``since``), once.
    private func assignIfNeeded(deadline: ContinuousClock.Instant) throws(KafkaError) {
        guard state.withLock({ $0 == nil }) else { return }
        let count = try handle.partitionCount(of: topic, deadline: deadline)
        let partitions = (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
        var starts = partitions.map { _ in Int64(RD_KAFKA_OFFSET_BEGINNING) }
        var next = Dictionary(uniqueKeysWithValues: partitions.map { ($0.partition, Int64(0)) })
        if let since {
            starts = try offsets(at: since, partitions, deadline: deadline)
            for (partition, start) in zip(partitions, starts) { next[partition.partition] = start }
        }
        let error = handle.withHandle { rk in
            withPartitionList(partitions, offsets: starts) { rd_kafka_assign(rk, $0) }
        }
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "assign \(topic)") }
        state.withLock { $0 = State(next: next, lastError: nil) }
    }

    /// Per partition, the offset of its first record stamped at or after `timestamp`, or its end
    /// when it has none.
    private func offsets(at timestamp: Int64, _ partitions: [TopicPartition], deadline: ContinuousClock.Instant) throws(KafkaError) -> [Int64] {
        try handle.withHandle { rk throws(KafkaError) -> [Int64] in
            try withPartitionList(partitions, offsets: partitions.map { _ in timestamp }) { list in Result { () throws(KafkaError) -> [Int64] in
                let error = rd_kafka_offsets_for_times(rk, list, remainingMilliseconds(deadline))
                guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "offsets of \(topic) at \(timestamp)") }
                var offsets: [Int64] = []
                for index in 0..<Int(list.pointee.cnt) {
                    let element = list.pointee.elems[index]
                    guard element.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                        throw KafkaError(element.err, context: "offset of \(topic) [\(element.partition)] at \(timestamp)")
                    }
                    if element.offset >= 0 {
                        offsets.append(element.offset)
                    } else {
                        var low: Int64 = 0, high: Int64 = 0
                        let error = rd_kafka_query_watermark_offsets(rk, topic, element.partition, &low, &high, remainingMilliseconds(deadline))
                        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "watermarks of \(topic) [\(element.partition)]") }
                        offsets.append(high)
                    }
                }
                return offsets
            } }.get()
        }
    }

    /// The records at these offsets (per partition), read by assigning each partition where
    /// they are; an offset the partition no longer holds (retention, compaction), or never
    /// held, is left out. Not with ``read(timeout:until:)`` or ``readToEnd(timeout:)`` on the
    /// same reader: this replaces their assignment.
    public func records(at wanted: [Int32: [Int64]], timeout: Duration) async throws(KafkaError) -> [Int32: [Int64: KafkaMessage]] {
        let deadline = ContinuousClock.now + timeout
        return try await runBlocking { [self] in
            Result { () throws(KafkaError) -> [Int32: [Int64: KafkaMessage]] in try reading.withLock { _ throws(KafkaError) in
                var found: [Int32: [Int64: KafkaMessage]] = [:]
                for (partition, offsets) in wanted.sorted(by: { $0.key < $1.key }) {
                    let ends = try handle.withHandle { rk throws(KafkaError) -> (low: Int64, high: Int64) in
                        var low: Int64 = 0, high: Int64 = 0
                        let error = rd_kafka_query_watermark_offsets(rk, topic, partition, &low, &high, remainingMilliseconds(deadline))
                        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "watermarks of \(topic) [\(partition)]") }
                        return (low, high)
                    }
                    var pending = Set(offsets.filter { $0 >= ends.low && $0 < ends.high }).sorted()[...]
                    while let first = pending.first {
                        let error = handle.withHandle { rk in
                            withPartitionList([TopicPartition(topic: topic, partition: partition)], offsets: [first]) { rd_kafka_assign(rk, $0) }
                        }
                        guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, context: "assign \(topic) [\(partition)]") }
                        // Reads on from there while the records keep coming in order: the next
                        // wanted ones are often close by.
                        var reached = first - 1
                        while let next = pending.first, next > reached, ContinuousClock.now < deadline {
                            let batch = try poll(deadline: deadline).filter { $0.partition == partition }
                            if batch.isEmpty, position(of: partition) >= ends.high {
                                // Past the last record (what follows is no record a reader
                                // gets: a transaction marker, say).
                                reached = ends.high - 1
                                break
                            }
                            for message in batch where message.offset >= first {
                                reached = max(reached, message.offset)
                                if pending.first.map({ message.offset >= $0 }) == true {
                                    while let head = pending.first, head < message.offset { pending.removeFirst() }
                                    if pending.first == message.offset {
                                        found[partition, default: [:]][message.offset] = message
                                        pending.removeFirst()
                                    }
                                }
                            }
                            if reached >= ends.high - 1 { break }
                            // Far ahead: assign there rather than read everything between.
                            if let head = pending.first, head > reached + 500 { break }
                        }
                        guard ContinuousClock.now < deadline else {
                            throw KafkaError(code: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue,
                                             message: "read \(topic) [\(partition)] at \(pending.count) offsets from \(pending.first ?? -1): not done in \(timeout)",
                                             isRetriable: true)
                        }
                        // Past the partition's end: nothing more to find there.
                        if reached >= ends.high - 1 { pending.removeAll() }
                    }
                }
                return found
            } }
        }.get()
    }

    /// One poll (up to 100 ms, or less before the deadline), then whatever else is ready.
    private func poll(deadline: ContinuousClock.Instant) throws(KafkaError) -> [KafkaMessage] {
        var batch: [KafkaMessage] = []
        handle.withHandle { rk in
            var timeout = min(100, remainingMilliseconds(deadline))
            while batch.count < 500, let message = rd_kafka_consumer_poll(rk, timeout) {
                timeout = 0
                defer { rd_kafka_message_destroy(message) }
                // Errors here are librdkafka's reports of what it retries on its own; the last
                // one is named if the read times out.
                guard message.pointee.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                    let error = KafkaError(message.pointee.err)
                    state.withLock { $0?.lastError = error.message }
                    continue
                }
                batch.append(KafkaMessage(copying: message))
            }
        }
        state.withLock { state in
            for message in batch { state?.next[message.partition] = message.offset + 1 }
        }
        return batch
    }

    /// librdkafka's position in `partition`: the offset after the last one it handed over or
    /// skipped (-1 before the first).
    private func position(of partition: Int32) -> Int64 {
        handle.withHandle { rk in
            withPartitionList([TopicPartition(topic: topic, partition: partition)]) { list in
                _ = rd_kafka_position(rk, list)
                return list.pointee.elems[0].offset
            }
        }
    }

    /// Leaves nothing behind (no group was joined, nothing to commit).
    public func close() async {
        let handle = self.handle
        await runBlocking { _ = handle.withHandle { rd_kafka_consumer_close($0) } }
    }
}

func remainingMilliseconds(_ deadline: ContinuousClock.Instant) -> Int32 {
    Int32(clamping: max((deadline - .now).totalMilliseconds, 0))
}
