import Foundation
import Redis
import Relay

/// What Redis has spent, summed over its nodes (every master of a Redis Cluster): its CPU time
/// (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`, seconds) and, per command, its calls and the
/// time spent executing them (`INFO commandstats`). Read before and after a run, the difference
/// per intent is what the relay's policy costs Redis, and which commands it goes to.
struct RedisCPU {
    var seconds: Double
    /// Per command (lower case, `set`, `mget`, `script|load`): calls and microseconds.
    var commands: [String: (calls: Int, microseconds: Int)]

    /// Nil without Redis, or when a node does not answer with the CPU fields.
    static func read(_ configuration: RelayConfiguration.RedisSettings) async -> RedisCPU? {
        guard !configuration.url.isEmpty, let settings = try? configuration.clientConfiguration(),
              let client = try? RedisClient(configuration: settings) else { return nil }
        let answers = try? await client.onEveryNode([RedisCommand("INFO", ["cpu"]), RedisCommand("INFO", ["commandstats"])])
        await client.shutdown()
        guard let answers, !answers.isEmpty else { return nil }
        var total = RedisCPU(seconds: 0, commands: [:])
        for (_, replies) in answers {
            guard let text = replies.first?.string, let seconds = parse(info: text) else { return nil }
            total.seconds += seconds
            let stats = replies.count > 1 ? replies[1].string.map(parse(commandstats:)) ?? [:] : [:]
            total.commands.merge(stats) { ($0.calls + $1.calls, $0.microseconds + $1.microseconds) }
        }
        return total
    }

    /// `used_cpu_sys` + `used_cpu_user` from `INFO cpu` text; nil when either is missing.
    static func parse(info: String) -> Double? {
        let fields = RedisInfo.fields(info)
        guard let system = fields["used_cpu_sys"].flatMap({ Double($0.trimmingCharacters(in: .whitespaces)) }),
              let user = fields["used_cpu_user"].flatMap({ Double($0.trimmingCharacters(in: .whitespaces)) }) else { return nil }
        return system + user
    }

    /// The `cmdstat_<name>:calls=N,usec=M,...` lines of `INFO commandstats`; a line without both
    /// fields is left out.
    static func parse(commandstats text: String) -> [String: (calls: Int, microseconds: Int)] {
        var commands: [String: (calls: Int, microseconds: Int)] = [:]
        for (name, value) in RedisInfo.fields(text) where name.hasPrefix("cmdstat_") {
            var calls: Int?, microseconds: Int?
            for field in value.split(separator: ",") {
                let pair = field.split(separator: "=", maxSplits: 1)
                guard pair.count == 2 else { continue }
                if pair[0] == "calls" { calls = Int(pair[1]) }
                if pair[0] == "usec" { microseconds = Int(pair[1]) }
            }
            if let calls, let microseconds { commands[String(name.dropFirst("cmdstat_".count))] = (calls, microseconds) }
        }
        return commands
    }

    /// What `after` spent since `self`, per intent, as the benchmark prints it: the CPU time,
    /// then the commands called at least once per hundred intents, each with its calls and
    /// execution time per intent, and the share of the CPU time their execution took (the rest
    /// is reading, writing and Redis' own work around the commands; scripts' time left out, as
    /// the commands they call are counted under their own names).
    func lines(until after: RedisCPU, intents: Int) -> [String] {
        let perIntent = Double(max(intents, 1))
        let cpu = (after.seconds - seconds) * 1_000_000
        var lines = [String(format: "redis_cpu_us_per_intent: %.1f", cpu / perIntent)]
        let spent = after.commands.compactMap { name, stats -> (String, Int, Int)? in
            let before = commands[name] ?? (0, 0)
            let calls = stats.calls - before.calls
            return calls * 100 >= intents ? (name, calls, stats.microseconds - before.microseconds) : nil
        }.sorted { $0.0 < $1.0 }
        guard !spent.isEmpty else { return lines }
        // A script's own time includes the commands it calls, which are counted under their
        // names too: scripts are left out of the sum.
        let scripts: Set<String> = ["eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"]
        let executing = Double(spent.filter { !scripts.contains($0.0) }.reduce(0) { $0 + $1.2 })
        lines.append("redis_commands_per_intent: " + spent.map {
            String(format: "%@=%.2f (%.1f us)", $0.0, Double($0.1) / perIntent, Double($0.2) / perIntent)
        }.joined(separator: " ") + String(format: "; executing them: %.0f%% of the CPU time", cpu > 0 ? executing * 100 / cpu : 0))
        return lines
    }
}
