import APNs
import APNsSimulator
import Foundation
import Relay

/// The soak's verdict: what was seen against what must hold (``Soak``).
extension Soak {
    // MARK: Verdict

    func missing() -> [String] {
        seen.withLock { seen in seen.produced.filter { seen.outcomes[$0] == nil } }
    }

    func verdict(elapsed: Duration) -> Verdict {
        let accepted = stack.simulator.accepted
        let sends = accepted.reduce(into: [String: Int]()) { $0[$1.apnsID.lowercased(), default: 0] += 1 }
        let twice = sends.values.reduce(0) { $0 + max(0, $1 - 1) }
        let (outOfOrder, badgeLowered) = Self.orderAndBadges(accepted)
        let sharedDevices = devices > 0
        return seen.withLock { seen in
            let missing = seen.produced.filter { seen.outcomes[$0] == nil }.count
            // Right: exactly one status that is not `duplicate` — `delivered`, or with shared
            // devices `coalesced` — and every `duplicate` of it saying the same (or nothing).
            // Or only `duplicate`s, all of one such answer: an intent recorded in Redis whose
            // outcome was lost with a killed relay, answered from its record on redelivery
            // (docs/outcomes.md, "Guarantees"). Such intents were in flight at a kill, as the
            // ones sent twice were: both count against one bound.
            var wrong = 0, coalescedAccepted = 0, fromRecordOnly = 0
            var examples: [String] = []
            for (id, statuses) in seen.outcomes.sorted(by: { $0.key < $1.key }) {
                var answers = statuses.filter { !$0.hasPrefix("duplicate") }
                // Only if APNs took it (a record of `delivered` without a send is a loss); a
                // `coalesced` record stands for an intent never sent.
                if answers.isEmpty, let recorded = statuses.first, recorded.hasPrefix("duplicate/"), Set(statuses).count == 1,
                   recorded != "duplicate/delivered" || sends[APNsIdentifiers.format(Intent.apnsID(for: id)).lowercased()] != nil {
                    answers = [String(recorded.dropFirst("duplicate/".count))]
                    fromRecordOnly += 1
                }
                let sent = sends[APNsIdentifiers.format(Intent.apnsID(for: id)).lowercased()] != nil
                guard answers.count == 1, let status = answers.first, (status == "delivered" && sent) || (sharedDevices && status == "coalesced"),
                      statuses.allSatisfy({ !$0.hasPrefix("duplicate/") || $0 == "duplicate/\(status)" }) else {
                    wrong += 1
                    if examples.count < 5 { examples.append("\(id): \(statuses.joined(separator: ", "))") }
                    continue
                }
                if status == "coalesced", sends[APNsIdentifiers.format(Intent.apnsID(for: id)).lowercased()] != nil { coalescedAccepted += 1 }
            }
            // Second outcomes: `duplicate` (a redelivery answered from Redis) or not.
            let again = seen.outcomes.values.flatMap { $0.dropFirst() }
            let againDuplicate = again.filter { $0.hasPrefix("duplicate") }.count
            let kills = seen.faults[.killRelay] ?? 0
            let bound = kills * maxInFlight + seen.unanswered
            let faults = Fault.allCases.map { "\(seen.faults[$0] ?? 0) \($0.rawValue)" }.joined(separator: ", ")
            if !examples.isEmpty { Self.progress("wrong, e.g. \(examples.joined(separator: "; "))") }
            // Every outcome names its own intent's lane, partition and offset.
            let misnamedIDs = seen.named.filter { id, named in seen.landed[id].map { named != [$0] } ?? false }.keys.sorted()
            let misnamed = misnamedIDs.count
            if let id = misnamedIDs.first {
                Self.progress("misnamed, e.g. \(id) landed at \(seen.landed[id] ?? "?"), its outcomes named \(seen.named[id]?.sorted() ?? [])")
            }
            let down = exited.withLock { $0 }
            let passed = missing == 0 && wrong == 0 && outOfOrder == 0 && badgeLowered == 0 && misnamed == 0 && down == 0
                && twice + coalescedAccepted + fromRecordOnly <= bound && !seen.produced.isEmpty
            let statuses = seen.outcomes.values.reduce(into: [String: Int]()) { counts, statuses in
                for status in statuses where !status.hasPrefix("duplicate") { counts[status, default: 0] += 1 }
            }.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
            let line = "soak: \(Int(elapsed.totalSeconds)) s, \(processes.withLock { $0.count }) relays (\(down) not running at the end), "
                + (sharedDevices ? "\(devices) devices, 2 lanes, badges, " : "")
                + "faults: \(faults); "
                + "intents \(seen.produced.count) (\(seen.produceFailures) not produced, \(seen.notOnTopic) reported produced but on no topic), "
                + "outcomes \(seen.outcomeEvents) "
                + "for \(seen.outcomes.count) intents (\(statuses); \(again.count) second ones, \(againDuplicate) of them duplicate), "
                + "missing \(missing), wrong \(wrong), "
                + "out of order \(outOfOrder), badge lowered \(badgeLowered), "
                + "naming another intent's lane, partition or offset \(misnamed), "
                + "sent twice \(twice) + coalesced after APNs accepted \(coalescedAccepted) + answered from the record only \(fromRecordOnly) "
                + "(bound \(bound): \(kills) kills × \(maxInFlight) in flight + \(seen.unanswered) unanswered in stalls): "
                + (passed ? "PASS" : "FAIL")
            return Verdict(line: line, passed: passed)
        }
    }

    /// In the order APNs took them: notifications of a device that came before an earlier one of
    /// its lane (the payload's `soak.seq`), and badges lower than the device's previous one.
    /// Notifications without those fields (a device per intent) count for neither.
    static func orderAndBadges(_ accepted: [AcceptedNotification]) -> (outOfOrder: Int, badgeLowered: Int) {
        var lastSequence: [String: Int] = [:], lastBadge: [String: Int] = [:]
        var outOfOrder = 0, badgeLowered = 0
        for notification in accepted {
            guard let payload = try? JSONSerialization.jsonObject(with: Data(notification.payload)) as? [String: Any] else { continue }
            if let soak = payload["soak"] as? [String: Any], let lane = soak["lane"] as? String, let sequence = soak["seq"] as? Int {
                let key = "\(notification.deviceToken) \(lane)"
                if let last = lastSequence[key], sequence < last { outOfOrder += 1 }
                lastSequence[key] = max(lastSequence[key] ?? sequence, sequence)
            }
            if let badge = (payload["aps"] as? [String: Any])?["badge"] as? Int {
                if let last = lastBadge[notification.deviceToken], badge < last { badgeLowered += 1 }
                lastBadge[notification.deviceToken] = max(lastBadge[notification.deviceToken] ?? badge, badge)
            }
        }
        return (outOfOrder, badgeLowered)
    }
}
