/// The pure part of a batch's admission: no I/O, no clock. ``group(_:rules:skipsKnownUnregistered:groups:members:)``
/// runs when a batch is consumed (before Redis is asked), ``apply(_:to:_:_:forgetsUnregistered:)`` turns Redis'
/// answer for each group into the intents' admissions.
public enum BatchAdmission {
    /// What the policy decided for a consumed intent before it reaches its device's queue.
    public enum Admission: Sendable, Equatable {
        case send
        /// APNs answered it before (what it answered, when the record says), or a copy is in
        /// flight here: outcome `duplicate`.
        case duplicate(AnswerRecord?)
        /// A newer intent of the batch or the mailbox takes its place: outcome `coalesced`.
        case coalesced(by: String)
        /// It sits in its mailbox already (a redelivery): no outcome now, its offset moves on.
        case inMailbox
        /// The device may not be sent to now and the intent is now-or-never: outcome `expired`.
        case nowOrNever
        /// The device may not be sent to before `due`: park it in the device's mailbox.
        case park(due: Int64)
        /// Taken from a mailbox after its expiration passed: outcome `expired`.
        case expiredParked
        /// APNs answered 410 for its (token, topic) at this time (epoch ms), and the intent does
        /// not say its token was registered since: outcome `unregistered` (`KnownUnregistered`).
        case knownUnregistered(at: Int64)
        /// Redis answered its device's read with an error while the rest of its batch was
        /// decided (its keys' hash slot being migrated, say), or a copy of it was answered, or an
        /// intent of its mailbox parked, after its batch's read began (``RecentAnswers``):
        /// decided again alone when its turn in its device's queue comes, with retries, so it
        /// holds up no other device.
        case readmit
        /// Its recipient already has `limits.max_waiting_per_recipient` intents waiting here:
        /// outcome `failed` (`RecipientBacklog`), nothing sent.
        case recipientBacklog
    }

    /// Groups the usable intents by device (or channel) and topic, in batch order, and marks in each group
    /// the older intents of a collapse id (where the topic coalesces) as collapsing into the
    /// newest: which one survives is decided with Redis' answer (``DeviceAdmission/decide``), as
    /// the newest may turn out unable to go out.
    ///
    /// Each group of a device's token reads the pair's remembered 410 (without the option a
    /// delivery deletes one only where the read found it: ``DeviceAdmission/Decided``);
    /// `skipsKnownUnregistered` (`policy.skip_known_unregistered`): it decides too.
    package static func group(_ parsed: [Result<Intent, InvalidIntent>], rules: (_ topic: String, _ recipient: String) -> PolicyConfiguration.Rules,
                              skipsKnownUnregistered: Bool = false, groups: inout [DeviceAdmission.Group], members: inout [[Int]]) {
        struct CollapseKey: Hashable { var token: String, topic: String, collapseID: String }
        func collapseKey(_ intent: Intent) -> CollapseKey? {
            guard let collapseID = intent.collapseID, rules(intent.topic, intent.recipient).coalesce else { return nil }
            return CollapseKey(token: intent.token, topic: intent.topic, collapseID: collapseID)
        }
        var newest: [CollapseKey: Int] = [:]
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry, let key = collapseKey(intent) else { continue }
            newest[key] = index
        }
        struct GroupKey: Hashable { var token: String, topic: String }
        var groupIndex: [GroupKey: Int] = [:]
        /// Batch index → (group, position in it), for the collapse marks.
        var placed: [Int: (group: Int, position: Int)] = [:]
        var collapsing: [(index: Int, into: Int)] = []
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry else { continue }
            if let key = collapseKey(intent), let last = newest[key], last != index { collapsing.append((index, last)) }
            let key = GroupKey(token: intent.recipient, topic: intent.topic)
            let group: Int
            if let existing = groupIndex[key] {
                group = existing
            } else {
                group = groups.count
                groupIndex[key] = group
                groups.append(DeviceAdmission.Group(token: key.token, topic: intent.topic,
                                                    rules: rules(intent.topic, intent.recipient)))
                // A channel has no 410 to remember.
                groups[group].readsUnregistered = intent.channelID == nil
                groups[group].skipsKnownUnregistered = skipsKnownUnregistered && intent.channelID == nil
                members.append([])
            }
            placed[index] = (group, groups[group].append(intent.id, nowOrNever: intent.expiration == 0,
                                                         registeredAt: intent.tokenRegisteredAt, expiration: intent.expiration))
            members[group].append(index)
        }
        for (index, into) in collapsing {
            guard let older = placed[index], let newer = placed[into] else { continue }
            groups[older.group].collapse(older.position, into: newer.position)
        }
    }

    /// Turns one group's answer into admissions: of the intents that must wait, the newest is
    /// parked and the older ones are `coalesced` by it (now-or-never ones expire instead).
    /// `forgetsUnregistered` hears, per position, whether a delivery deletes the pair's
    /// remembered 410 (``DeviceAdmission/Decided/forgetsUnregistered``).
    package static func apply(_ answer: DeviceAdmission.Decided, to positions: [Int], _ parsed: [Result<Intent, InvalidIntent>],
                              _ admissions: inout [Admission], forgetsUnregistered: inout [Bool]) {
        var parking: Int?
        // Newest first, by index (no reversed copy of the pairs).
        for member in stride(from: min(positions.count, answer.decisions.count) - 1, through: 0, by: -1) {
            let position = positions[member], decision = answer.decisions[member]
            guard case .success(let intent) = parsed[position] else { continue }
            forgetsUnregistered[position] = answer.forgetsUnregistered
            switch decision {
            case .send: admissions[position] = .send
            case .duplicate(let record): admissions[position] = .duplicate(record)
            case .inMailbox: admissions[position] = .inMailbox
            case .knownUnregistered(let at): admissions[position] = .knownUnregistered(at: at)
            case .coalesced(let survivor):
                guard case .success(let newer) = parsed[positions[survivor]] else { continue }
                // A copy of the surviving intent is that intent: a duplicate.
                admissions[position] = newer.id == intent.id ? .duplicate(nil) : .coalesced(by: newer.id)
            case .wait:
                if intent.expiration == 0 {
                    admissions[position] = .nowOrNever
                } else if let parking, case .success(let newer) = parsed[parking] {
                    // A copy of the intent being parked is that intent: a duplicate.
                    admissions[position] = newer.id == intent.id ? .duplicate(nil) : .coalesced(by: newer.id)
                } else {
                    admissions[position] = .park(due: answer.due)
                    parking = position
                }
            }
        }
    }
}
