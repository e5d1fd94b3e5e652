import Foundation
import Redis
import Relay

/// The CPU time Redis has spent (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`, seconds), summed
/// over its nodes (every master of a Redis Cluster). Read before and after a run, its difference
/// per intent is what the relay's policy costs Redis.
enum RedisCPU {
    /// Nil without Redis, or when a node does not answer with both fields.
    static func seconds(_ configuration: RelayConfiguration.RedisSettings) async -> Double? {
        guard !configuration.url.isEmpty, let settings = try? configuration.clientConfiguration(),
              let client = try? RedisClient(configuration: settings) else { return nil }
        let answers = try? await client.onEveryNode([RedisCommand("INFO", ["cpu"])])
        await client.shutdown()
        guard let answers, !answers.isEmpty else { return nil }
        var total = 0.0
        for (_, replies) in answers {
            guard let text = replies.first?.string, let seconds = parse(info: text) else { return nil }
            total += seconds
        }
        return total
    }

    /// `used_cpu_sys` + `used_cpu_user` from `INFO cpu` text; nil when either is missing.
    static func parse(info: String) -> Double? {
        var system: Double?, user: Double?
        for line in info.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { continue }
            switch parts[0] {
            case "used_cpu_sys": system = Double(parts[1].trimmingCharacters(in: .whitespaces))
            case "used_cpu_user": user = Double(parts[1].trimmingCharacters(in: .whitespaces))
            default: continue
            }
        }
        guard let system, let user else { return nil }
        return system + user
    }
}
