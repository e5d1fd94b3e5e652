import APNs

/// The Live Activity budgets a device keeps (``SimulatorConfiguration/Behaviour/liveActivityBudgets``),
/// counted as a device counts them: sliding windows over when it took each push.
extension SharedState {
    /// Why the device would drop `accepted` for a Live Activity budget (``SimulatorConfiguration/Behaviour/liveActivityBudgets``),
    /// or nil, counting it when it spends one: a device counts what it takes, not what it drops.
    static func overBudget(_ state: inout Fields, _ accepted: AcceptedNotification) -> String? {
        guard let budgets = state.behaviour.liveActivityBudgets, let event = accepted.liveActivityEvent else { return nil }
        let (name, limit, window): (String, Int, Int64)
        if event == "start" {
            (name, limit, window) = ("start", budgets.startsPerWindow, budgets.startWindow.nanoseconds / 1_000_000)
        } else if accepted.priority == 10 {
            (name, limit, window) = ("priority10", budgets.priority10PerHour, 3_600_000)
        } else {
            return nil
        }
        let key = "\(accepted.deviceToken) \(name)"
        var spends = state.liveActivitySpends[key, default: []].filter { $0 > accepted.receivedAt - window }
        defer { state.liveActivitySpends[key] = spends }
        guard spends.count < limit else {
            // An `end` ends the activity whatever the budget: the system throttles updates, and
            // an activity left showing past its end would be worse than an alert spent.
            return event == "end" ? nil : "over the device's Live Activity \(name) budget"
        }
        spends.append(accepted.receivedAt)
        return nil
    }
}
