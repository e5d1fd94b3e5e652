extension RelayPipeline {
    /// What the policy decided for a consumed intent before it reaches its device's queue.
    enum Admission: Sendable, Equatable {
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
    }
}

/// The pure part of a batch's admission: no I/O, no clock. ``group(_:rules:admissions:groups:members:)``
/// runs when a batch is consumed (before Redis is asked), ``apply(_:to:_:_:)`` turns Redis'
/// answer for each group into the intents' admissions.
enum BatchAdmission {
    typealias Admission = RelayPipeline.Admission

    /// Collapses in-batch duplicates of a collapse id (the older ones are `coalesced` by the
    /// newest) and groups the other usable intents by device and topic, in batch order.
    static func group(_ parsed: [Result<Intent, InvalidIntent>], rules: (String) -> RelayConfiguration.Policy.Rules,
                      admissions: inout [Admission], groups: inout [DevicePolicy.Group], members: inout [[Int]]) {
        struct CollapseKey: Hashable { var token: String, topic: String, collapseID: String }
        var newest: [CollapseKey: Int] = [:]
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry, let collapseID = intent.collapseID, rules(intent.topic).coalesce else { continue }
            newest[CollapseKey(token: intent.token, topic: intent.topic, collapseID: collapseID)] = index
        }
        struct GroupKey: Hashable { var token: String, topic: String }
        var groupIndex: [GroupKey: Int] = [:]
        for (index, entry) in parsed.enumerated() {
            guard case .success(let intent) = entry else { continue }
            if let collapseID = intent.collapseID,
               let last = newest[CollapseKey(token: intent.token, topic: intent.topic, collapseID: collapseID)], last != index,
               case .success(let newer) = parsed[last] {
                admissions[index] = .coalesced(by: newer.id)
                continue
            }
            let key = GroupKey(token: intent.token, topic: intent.topic)
            if let existing = groupIndex[key] {
                groups[existing].ids.append(intent.id)
                members[existing].append(index)
            } else {
                groupIndex[key] = groups.count
                groups.append(DevicePolicy.Group(token: intent.token, topic: intent.topic, ids: [intent.id], rules: rules(intent.topic)))
                members.append([index])
            }
        }
    }

    /// Turns one group's answer into admissions: of the intents that must wait, the newest is
    /// parked and the older ones are `coalesced` by it (now-or-never ones expire instead).
    static func apply(_ answer: (decisions: [DevicePolicy.Admission], due: Int64), to positions: [Int],
                      _ parsed: [Result<Intent, InvalidIntent>], _ admissions: inout [Admission]) {
        var parking: Int?
        for (position, decision) in zip(positions, answer.decisions).reversed() {
            guard case .success(let intent) = parsed[position] else { continue }
            switch decision {
            case .send: admissions[position] = .send
            case .duplicate(let record): admissions[position] = .duplicate(record)
            case .inMailbox: admissions[position] = .inMailbox
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
