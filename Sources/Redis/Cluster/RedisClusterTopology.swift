/// Where a Redis node listens: `host:port`.
public struct RedisNodeAddress: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// `host:port`, `[v6 address]:port`; an empty host (a redirect's way of saying "the node
    /// you asked") becomes `defaultHost`.
    public init(parsing text: some StringProtocol, defaultHost: String? = nil) throws(RedisError) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
              (1...65535).contains(port) else {
            throw .invalidURL("expected host:port, got \(text)")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host.isEmpty, let defaultHost { host = defaultHost }
        guard !host.isEmpty, !host.contains(" ") else { throw .invalidURL("expected host:port, got \(text)") }
        self.init(host: host, port: port)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Which master serves each hash slot, as `CLUSTER SHARDS` (Redis 7) or `CLUSTER SLOTS`
/// (older servers) describe it.
struct RedisClusterTopology: Sendable, Equatable {
    /// The masters serving at least one slot, in address order.
    var masters: [RedisNodeAddress] = []
    /// Per slot, the index of its master in `masters`; -1 when none serves it.
    var owners = [Int32](repeating: -1, count: RedisHashSlot.count)

    /// No slot served (before the first read).
    init() {}

    var coveredSlots: Int { owners.reduce(0) { $0 + ($1 >= 0 ? 1 : 0) } }

    func owner(of slot: Int) -> RedisNodeAddress? {
        let index = owners[slot]
        return index >= 0 ? masters[Int(index)] : nil
    }

    /// Slots a reply may assign in all (each at most four times over): a real map assigns each
    /// slot once, and a reply naming whole ranges again and again would take the client's
    /// time without bound.
    static let maxAssignedSlots = 4 * RedisHashSlot.count

    /// `known`: each master's place in `masters` so far (a reply may name many).
    private mutating func assign(_ range: ClosedRange<Int>, to master: RedisNodeAddress, _ known: inout [RedisNodeAddress: Int]) {
        let index: Int
        if let place = known[master] {
            index = place
        } else {
            index = masters.count
            known[master] = index
            masters.append(master)
        }
        for slot in range { owners[slot] = Int32(index) }
    }

    /// Only the masters that serve a slot (ranges named twice leave the first owner none), in
    /// address order, so that two nodes' answers describing the same map are equal.
    private mutating func normalize() {
        var serving = [Bool](repeating: false, count: masters.count)
        for owner in owners where owner >= 0 { serving[Int(owner)] = true }
        let sorted = masters.indices.filter { serving[$0] }.map { masters[$0] }.sorted { ($0.host, $0.port) < ($1.host, $1.port) }
        let position = Dictionary(uniqueKeysWithValues: sorted.enumerated().map { ($1, Int32($0)) })
        let remap = masters.map { position[$0] ?? -1 }
        owners = owners.map { $0 >= 0 ? remap[Int($0)] : -1 }
        masters = sorted
    }

    private static func slotRange(_ start: RESPValue, _ end: RESPValue) -> ClosedRange<Int>? {
        guard let first = start.integer, let last = end.integer, first >= 0, first <= last,
              last < RedisHashSlot.count else { return nil }
        return Int(first)...Int(last)
    }

    /// From a `CLUSTER SHARDS` reply: each shard's slot ranges go to its master. `asked` is the
    /// node that answered (its host stands in for an endpoint the reply leaves empty); with
    /// `tls`, a node's `tls-port` is used where it names one. Nil when the reply is not one.
    init?(shards reply: RESPValue, asked: RedisNodeAddress, tls: Bool) {
        guard let shards = reply.array else { return nil }
        var known: [RedisNodeAddress: Int] = [:]
        var assigned = 0
        for shard in shards {
            guard let fields = Self.fields(shard), let slots = fields["slots"]?.array, let nodes = fields["nodes"]?.array else {
                return nil
            }
            // After a failover the shard names its failed master too (health `fail`).
            let masters = nodes.compactMap(Self.fields).filter { $0["role"]?.string == "master" }
            let master = masters.first { $0["health"]?.string == "online" } ?? masters.first
            guard let master, !slots.isEmpty else { continue }
            let port = (tls ? master["tls-port"]?.integer : nil) ?? master["port"]?.integer
            var host = master["endpoint"]?.string ?? ""
            if host.isEmpty || host == "?" { host = master["ip"]?.string ?? "" }
            if host.isEmpty { host = asked.host }
            guard let port, (1...65535).contains(port), host != "?" else { continue }
            for index in stride(from: 0, to: slots.count - 1, by: 2) {
                guard let range = Self.slotRange(slots[index], slots[index + 1]) else { return nil }
                assigned += range.count
                guard assigned <= Self.maxAssignedSlots else { return nil }
                assign(range, to: RedisNodeAddress(host: host, port: Int(port)), &known)
            }
        }
        normalize()
    }

    /// From a `CLUSTER SLOTS` reply: `[start, end, [host, port, id, ...], replicas...]` per range.
    init?(slots reply: RESPValue, asked: RedisNodeAddress) {
        guard let ranges = reply.array else { return nil }
        var known: [RedisNodeAddress: Int] = [:]
        var assigned = 0
        for entry in ranges {
            guard let values = entry.array, values.count >= 3, let range = Self.slotRange(values[0], values[1]),
                  let master = values[2].array, master.count >= 2, let port = master[1].integer,
                  (1...65535).contains(port) else { return nil }
            var host = master[0].string ?? ""
            if host.isEmpty { host = asked.host }
            guard host != "?" else { continue }
            assigned += range.count
            guard assigned <= Self.maxAssignedSlots else { return nil }
            assign(range, to: RedisNodeAddress(host: host, port: Int(port)), &known)
        }
        normalize()
    }

    /// A flat `[name, value, name, value...]` array (RESP2's map) as a dictionary.
    private static func fields(_ value: RESPValue) -> [String: RESPValue]? {
        guard let values = value.array, values.count % 2 == 0 else { return nil }
        var fields: [String: RESPValue] = [:]
        for index in stride(from: 0, to: values.count, by: 2) {
            guard let name = values[index].string else { return nil }
            fields[name] = values[index + 1]
        }
        return fields
    }
}

/// What an error reply asks of a cluster client.
enum RedisClusterRedirect: Equatable {
    /// `MOVED <slot> <host:port>`: the slot has a new owner (refresh the map).
    case moved(RedisNodeAddress)
    /// `ASK <slot> <host:port>`: this once, ask that node (after `ASKING`).
    case ask(RedisNodeAddress)
    /// `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`: the same node (or the slot's owner) later.
    case again

    /// `asked` is the node that answered (an empty host in the reply means it).
    init?(_ message: String, asked: RedisNodeAddress) {
        let parts = message.split(separator: " ")
        guard let code = parts.first else { return nil }
        switch code {
        case "MOVED", "ASK":
            guard parts.count >= 3, let address = try? RedisNodeAddress(parsing: parts[2], defaultHost: asked.host) else { return nil }
            self = code == "MOVED" ? .moved(address) : .ask(address)
        case "TRYAGAIN", "CLUSTERDOWN", "LOADING":
            self = .again
        default:
            return nil
        }
    }
}
