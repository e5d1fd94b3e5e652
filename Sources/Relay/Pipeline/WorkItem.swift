import Kafka
import W3CTraceContext

extension RelayPipeline {
    /// One consumed message (or one intent taken from a mailbox) on its way to an outcome; a
    /// class, so the async frames on the way hold one reference instead of the intent.
    final class WorkItem: Sendable {
        let partition: TopicPartition
        /// Its lane: the index of its intents topic in `kafka.lanes` (0 with one lane).
        let lane: Int
        let offset: Int64
        let generation: Int
        let consumedAt: ContinuousClock.Instant
        let intent: Result<Intent, InvalidIntent>
        let admission: Admission
        /// APNs' answer to it is recorded for dedupe (a usable intent to send, with Redis);
        /// among the items in flight, only one per (token, topic, id) does.
        let recordsAnswer: Bool
        /// Counted in ``DeviceQueues/answering`` from its enqueueing until it finishes
        /// (its slot freed): copies admitted meanwhile are answered from it. Its own
        /// ``recordsAnswer`` when made; kept when it is decided again in its turn, whatever
        /// that decides (a copy decided `duplicate` records nothing, but was counted).
        let holdsAnswer: Bool
        /// Taken from a mailbox: its due-index member (its offset was committed when it was
        /// parked, so this item stores none).
        let mailboxMember: String?
        /// The W3C trace context its message carried (`traceparent`, `tracestate` headers), if
        /// valid: its outcome carries it on.
        let trace: TraceContext?
        /// Its spans' times, when it is traced (``IntentTrace``).
        let traced: IntentTrace?
        /// What the policy decided for it (``RelayPipeline/policyDecision(_:)``): with Redis,
        /// on its outcome as `policy_decision`; in shadow mode the decision it was not held to.
        let policyDecision: String?
        /// Taken from a mailbox: where its intent came from (its entry's lane and partition),
        /// which its outcome names; the item's own partition is the due index's it was found in.
        let origin: TopicPartition?
        /// The device (or channel, ``Intent/recipient``) whose queue this item waits in: items that are sent or parked, and those
        /// answered from what APNs said before (duplicates, known-unregistered tokens), whose
        /// outcome and invalidation record must follow the device's earlier ones (a replay's
        /// 410 and the delivery after it end in that order on the invalidations topic; across
        /// lanes an urgent send may overtake, see ``DeviceQueues/enqueue(_:)``).
        /// Worked out once: it is asked several times on every intent's way.
        let queueToken: String?
        /// Its delivery deletes the pair's remembered 410 (``RelayPipeline/unregisteredChange(_:_:)``):
        /// false only where its admission read found none and the relay remembers no 410s
        /// itself (``DeviceAdmission/Decided/forgetsUnregistered``).
        let forgetsUnregistered: Bool

        init(partition: TopicPartition, lane: Int = 0, offset: Int64, generation: Int, consumedAt: ContinuousClock.Instant,
             intent: Result<Intent, InvalidIntent>, admission: Admission = .send, recordsAnswer: Bool = false,
             holdsAnswer: Bool? = nil, mailboxMember: String? = nil, trace: TraceContext? = nil, traced: IntentTrace? = nil,
             policyDecision: String? = nil, origin: TopicPartition? = nil, forgetsUnregistered: Bool = true) {
            self.partition = partition
            self.lane = lane
            self.offset = offset
            self.generation = generation
            self.consumedAt = consumedAt
            self.intent = intent
            self.admission = admission
            self.recordsAnswer = recordsAnswer
            self.holdsAnswer = holdsAnswer ?? recordsAnswer
            self.mailboxMember = mailboxMember
            self.trace = trace
            self.traced = traced
            self.policyDecision = policyDecision
            self.origin = origin
            self.forgetsUnregistered = forgetsUnregistered
            self.queueToken = Self.queueToken(intent, admission)
        }

        /// The same item with another admission (an intent to send that is to park instead, its
        /// device's earlier intent having parked).
        func admitted(as admission: Admission, recordsAnswer: Bool? = nil, policyDecision: String? = nil,
                      forgetsUnregistered: Bool? = nil) -> WorkItem {
            WorkItem(partition: partition, lane: lane, offset: offset, generation: generation, consumedAt: consumedAt,
                     intent: intent, admission: admission, recordsAnswer: recordsAnswer ?? self.recordsAnswer,
                     holdsAnswer: holdsAnswer, mailboxMember: mailboxMember, trace: trace, traced: traced, policyDecision: policyDecision ?? self.policyDecision,
                     origin: origin, forgetsUnregistered: forgetsUnregistered ?? self.forgetsUnregistered)
        }

        /// ``queueToken``.
        private static func queueToken(_ intent: Result<Intent, InvalidIntent>, _ admission: Admission) -> String? {
            guard case .success(let intent) = intent else { return nil }
            switch admission {
            case .send, .park, .duplicate, .knownUnregistered, .readmit: return intent.recipient
            default: return nil
            }
        }
    }
}

extension RelayPipeline.WorkItem: DeviceQueueItem {
    var partitionNumber: Int32 { partition.partition }

    func withAdmission(_ admission: RelayPipeline.Admission) -> RelayPipeline.WorkItem {
        admitted(as: admission)
    }
}
