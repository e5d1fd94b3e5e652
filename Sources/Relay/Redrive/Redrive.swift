import APNs
import Common
import Foundation
import Kafka
import Redis

/// `apns-relay redrive`: reads the outcomes topic from `filter.since`, picks the intents the
/// filter matches (``RedriveSelection``), fetches each one from its lane by partition and offset,
/// and produces it again to that partition of its lane, marked (the intent's `redrive` field, which its outcomes
/// carry, and an `apns-relay-redrive: <lane>/<partition>/<offset>` header). Skipped, with the
/// reason counted: intents a later outcome answered, ones a newer delivery or a newer re-driven
/// intent with their `collapse_id` supersedes, expired ones, ones the topic
/// no longer holds or that no longer read as intents and, with Redis, ones whose dedupe record
/// says they were answered or that a redrive produced already.
public struct Redrive: Sendable {
    public let configuration: RelayConfiguration
    public let filter: RedriveFilter
    /// Decide and report, produce nothing and mark nothing.
    public var dryRun = false
    /// How long each Kafka read (and each produce) may take.
    public var timeout: Duration = .seconds(120)
    /// Start reading the outcomes at `filter.since` by the broker's time index (the offset of
    /// each partition's first record stamped then or later); false: from each partition's
    /// start (the outcomes are filtered by their `at` all the same; `--from-start`).
    /// librdkafka's mock cluster answers no offset for a time, so the tests read from the start.
    public var seeksByTime = true

    public init(configuration: RelayConfiguration, filter: RedriveFilter) {
        self.configuration = configuration
        self.filter = filter
    }

    /// The header naming the original of a re-driven intent: `<lane>/<partition>/<offset>`.
    public static let header = "apns-relay-redrive"

    /// What one intent came to.
    public struct Decision: Sendable {
        public var outcome: RedriveSelection.Outcome
        /// Nil: re-driven (or, in a dry run, would be).
        public var skipped: RedriveSelection.Skip?
        /// Where the re-driven record landed (`<lane> <partition>/<offset>`), nil in a dry run.
        public var landed: String?

        /// One JSON line: `{"action":"redrive"|"would_redrive"|"skip","reason":…,"id":…,…}`.
        public func json(dryRun: Bool) -> String {
            var writer = JSONObjectWriter(capacity: 256)
            writer.add("action", skipped == nil ? (dryRun ? "would_redrive" : "redrive") : "skip")
            writer.addOrNull("reason", skipped?.rawValue)
            writer.add("id", outcome.id)
            writer.add("topic", outcome.topic)
            writer.add("status", outcome.status)
            writer.addOrNull("outcome_reason", outcome.reason)
            writer.add("lane", outcome.lane)
            writer.add("partition", Int(outcome.partition))
            writer.add("offset", outcome.offset)
            writer.add("outcome_at", outcome.at)
            writer.addOrNull("landed", landed)
            return String(decoding: writer.finish(), as: UTF8.self)
        }
    }

    /// What a run did.
    public struct Report: Sendable {
        public var outcomesRead = 0
        public var redriven = 0
        public var skipped: [RedriveSelection.Skip: Int] = [:]
        public var decisions: [Decision] = []

        /// `outcomes read 1200, re-driven 40, skipped 12 (answered 10, expired 2)`.
        public func summary(dryRun: Bool) -> String {
            let skips = RedriveSelection.Skip.allCases.compactMap { reason in skipped[reason].map { "\(reason.rawValue) \($0)" } }
            let total = skipped.values.reduce(0, +)
            return "outcomes read \(outcomesRead), \(dryRun ? "would re-drive" : "re-driven") \(redriven), skipped \(total)"
                + (skips.isEmpty ? "" : " (\(skips.joined(separator: ", ")))")
        }
    }

    /// Runs it at `now` (ms since the epoch; nil: now). `progress` hears a line now and then on a long run; `decided` each decision as
    /// it is taken. Throws when Kafka or Redis failed: what was produced before stays produced
    /// and marked, so running it again goes on from there.
    public func run(now: Int64? = nil, progress: @escaping @Sendable (String) -> Void = { _ in },
                    decided: (Decision) -> Void = { _ in }) async throws -> Report {
        let now = now ?? APNsIdentifiers.epochMilliseconds()
        var report = Report()
        let kafka = configuration.kafka
        // 1. The outcomes from `since` on.
        let reader = try KafkaTopicReader(bootstrapServers: kafka.brokers, topic: kafka.outcomesTopic, properties: kafka.consumerSettings,
                                          since: seeksByTime ? filter.since : nil)
        // Folded into the selection as they come: what it keeps is per intent, not per outcome read.
        let folded = Locked(RedriveSelection(filter: filter))
        do {
            try await reader.readToEnd(timeout: timeout) { batch in
                let total = folded.withLock { selection in
                    for message in batch {
                        if let outcome = RedriveSelection.Outcome(json: message.value) { selection.add(outcome) }
                    }
                    return selection.outcomesRead
                }
                if total / 10_000 != (total - batch.count) / 10_000 { progress("read \(total) outcomes") }
            }
        } catch {
            await reader.close()
            throw error
        }
        await reader.close()
        let selection = folded.withLock { $0 }
        report.outcomesRead = selection.outcomesRead
        let (chosen, skipped) = selection.decide()
        func note(_ decision: Decision) {
            if let skip = decision.skipped { report.skipped[skip, default: 0] += 1 } else { report.redriven += 1 }
            report.decisions.append(decision)
            decided(decision)
        }
        for (outcome, reason) in skipped { note(Decision(outcome: outcome, skipped: reason)) }
        progress("\(chosen.count) intents to fetch, \(skipped.count) skipped from the outcomes alone")
        guard !chosen.isEmpty else { return report }

        // 2. Their originals, one lane at a time.
        var originals: [String: KafkaMessage] = [:]
        for (lane, outcomes) in Dictionary(grouping: chosen, by: \.lane) {
            let laneReader = try KafkaTopicReader(bootstrapServers: kafka.brokers, topic: lane, properties: kafka.consumerSettings)
            let wanted = Dictionary(grouping: outcomes, by: \.partition).mapValues { $0.map(\.offset) }
            let found: [Int32: [Int64: KafkaMessage]]
            do {
                found = try await laneReader.records(at: wanted, timeout: timeout)
            } catch {
                await laneReader.close()
                throw error
            }
            await laneReader.close()
            for (partition, records) in found {
                for (offset, message) in records { originals["\(lane) \(partition) \(offset)"] = message }
            }
        }

        // 3. The guards that need the original (and the dedupe record, with Redis).
        let redis = configuration.redis.url.isEmpty ? nil : try RedisClient(configuration: configuration.redis.clientConfiguration())
        let keys = RedisKeys(prefix: configuration.redis.keyPrefix)
        defer {
            if let redis { Task { await redis.shutdown() } }
        }
        /// Throws an error reply: it says nothing of what Redis holds.
        func ask(_ redis: RedisClient, _ command: RedisCommand) async throws -> RESPValue {
            let reply = try await redis.send(command)
            if case .error(let message) = reply { throw RedisError.server(message) }
            return reply
        }
        var checked: [(outcome: RedriveSelection.Outcome, original: KafkaMessage, intent: Intent)] = []
        for (done, outcome) in chosen.enumerated() {
            if (done + 1) % 100 == 0 { progress("\(done + 1) of \(chosen.count) intents checked") }
            guard let original = originals["\(outcome.lane) \(outcome.partition) \(outcome.offset)"] else {
                note(Decision(outcome: outcome, skipped: .gone))
                continue
            }
            // Read as the relay read it then: a default expiration runs from when it was produced.
            let producedAt = (original.timestamp ?? outcome.at) / 1000
            guard let intent = try? Intent.parse(original.value, key: original.key, now: producedAt,
                                                 defaultTTL: configuration.defaults.expirationSeconds),
                  intent.id == outcome.id, intent.topic == outcome.topic, intent.recipient == outcome.recipient else {
                note(Decision(outcome: outcome, skipped: .invalid))
                continue
            }
            guard intent.expiration > 0, intent.expiration * 1000 > now else {
                note(Decision(outcome: outcome, skipped: .expired))
                continue
            }
            if let redis, !(try await ask(redis, RedisCommand("GET", [keys.seen(token: intent.recipient, topic: intent.topic, id: intent.id)]))).isNull {
                note(Decision(outcome: outcome, skipped: .answered))
                continue
            }
            // A newer intent of the device waiting in its mailbox, or being sent from it: the
            // re-driven one, newer there by its new offset, would displace it (or follow it).
            if let redis, Self.mailboxHoldsNewer(try await ask(redis, RedisCommand("HMGET", [
                keys.mailbox(token: intent.recipient, topic: intent.topic), "pid", "p", "cid", "c",
            ])), than: outcome, defaultLane: configuration.kafka.intentsTopic) {
                note(Decision(outcome: outcome, skipped: .superseded))
                continue
            }
            checked.append((outcome, original, intent))
        }
        // 4. Of those with one collapse id for one recipient, the newest only: the older ones
        // would only replace it on the device.
        var covered: Set<String> = []
        var superseded: Set<Int> = []
        for (index, candidate) in checked.enumerated().reversed() {
            guard let collapseID = candidate.intent.collapseID else { continue }
            let key = RedriveSelection.collapseKey(candidate.outcome, collapseID)
            if !covered.insert(key).inserted { superseded.insert(index) }
        }

        // 5. Marked (with Redis) and produced, oldest first: to its lane and its partition, so
        // that it reaches the relay that holds its device's other intents.
        let producer = dryRun ? nil : try KafkaProducer(bootstrapServers: kafka.brokers, properties: kafka.producerSettings)
        do {
            for (index, candidate) in checked.enumerated() {
                let (outcome, original, intent) = candidate
                if superseded.contains(index) {
                    note(Decision(outcome: outcome, skipped: .superseded))
                    continue
                }
                let mark = keys.redrive(token: intent.recipient, topic: intent.topic, id: intent.id)
                if let redis {
                    // Short at first: a run that dies before its produce leaves the intent to
                    // the next run minutes later, not for its whole expiration.
                    let marked = dryRun ? try await ask(redis, RedisCommand("EXISTS", [mark])).integer == 0
                        : !(try await ask(redis, RedisCommand("SET", [mark, now, "NX", "PX", Self.markBeforeProducing.totalMilliseconds]))).isNull
                    guard marked else {
                        note(Decision(outcome: outcome, skipped: .redriven))
                        continue
                    }
                }
                guard let producer else {
                    note(Decision(outcome: outcome))
                    continue
                }
                let value = Self.marked(original.value, lane: outcome.lane, partition: outcome.partition, offset: outcome.offset, at: now,
                                        expiration: intent.expiration)
                var headers = original.headers.filter { $0.name != Self.header }
                headers.append(KafkaHeader(name: Self.header, value: Array("\(outcome.lane)/\(outcome.partition)/\(outcome.offset)".utf8)))
                let delivery: KafkaProducer.Delivery
                do {
                    delivery = try await producer.send(topic: outcome.lane, partition: outcome.partition, key: original.key, value: value,
                                                       headers: headers)
                } catch {
                    // Not produced (as far as librdkafka knows): its mark goes, so that the
                    // next run tries it again.
                    if let redis { _ = try? await redis.send(RedisCommand("DEL", [mark])) }
                    throw error
                }
                // Produced: marked for as long as it lives.
                if let redis {
                    _ = try await ask(redis, RedisCommand("PEXPIRE", [mark, max(intent.expiration * 1000 - now, Self.markBeforeProducing.totalMilliseconds)]))
                }
                note(Decision(outcome: outcome, landed: "\(outcome.lane) \(delivery.partition)/\(delivery.offset)"))
            }
        } catch {
            await producer?.close()
            throw error
        }
        await producer?.close()
        return report
    }

    /// How long a redrive mark stands before its produce is confirmed.
    static let markBeforeProducing = Duration.seconds(300)

    /// Whether a device's mailbox (`HMGET pid p cid c`) holds another intent that came after
    /// `outcome`'s (later in the same lane's partition, else consumed after `outcome`'s intent
    /// was): parked there, the re-driven copy (newer there by its new offset) would displace
    /// it; being sent, only one with the same `collapse_id` is superseding (the copy would
    /// follow it to the device). An entry no relay could read counts (nothing is re-driven past
    /// what cannot be told).
    static func mailboxHoldsNewer(_ reply: RESPValue, than outcome: RedriveSelection.Outcome, defaultLane: String) -> Bool {
        guard let fields = reply.array, fields.count == 4 else { return false }
        for (id, entry, parked) in [(fields[0], fields[1], true), (fields[2], fields[3], false)] {
            guard let id = id.string, id != outcome.id else { continue }
            guard let bytes = entry.bytes, let entry = DevicePolicy.Entry(bytes) else { return true }
            let origin = outcome.origin
            let newer = (entry.lane ?? defaultLane) == origin.lane && entry.partition == origin.partition
                ? entry.offset > origin.offset : entry.consumedAt > outcome.consumedAt
            guard newer else { continue }
            if parked { return true }
            let object = try? JSONSerialization.jsonObject(with: Data(entry.message)) as? [String: Any]
            if let collapseID = outcome.collapseID, object?["collapse_id"] as? String == collapseID { return true }
        }
        return false
    }

    /// The intent's message with `redrive` and its expiration added as its last members, which
    /// the relay reads over earlier ones of the same name.
    static func marked(_ value: [UInt8], lane: String, partition: Int32, offset: Int64, at: Int64, expiration: Int64) -> [UInt8] {
        var mark = JSONObjectWriter(capacity: 128)
        mark.add("lane", lane)
        mark.add("partition", Int(partition))
        mark.add("offset", offset)
        mark.add("at", at)
        var added = Array(#","redrive":"#.utf8) + mark.finish()
        // The expiration it had (a default one ran from when it was first produced): a
        // re-driven intent does not live longer than its original would have.
        added += Array(#","expiration":\#(expiration)"#.utf8)
        guard let close = value.lastIndex(of: UInt8(ascii: "}")) else { return value }
        return Array(value[..<close]) + added + Array(value[close...])
    }
}
