import Common
import Relay

/// The outcomes a relay in this process published, in order, each once its delivery report
/// succeeded (the pipeline's `published` callback): what tests wait on instead of polling the
/// relay's counts or reading the topic with a consumer group.
struct PublishedOutcomes: Sendable, CustomStringConvertible {
    var all: [Outcome] = []

    /// How many have this status (`delivered`, `failed`...).
    func count(_ status: String) -> Int { all.count { $0.status.rawValue == status } }

    var description: String {
        let byStatus = Dictionary(grouping: all, by: \.status.rawValue).mapValues(\.count)
        return "\(all.count) published (\(byStatus.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")))"
    }
}
