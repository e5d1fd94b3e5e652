/// One call's way through a Redis Cluster, round by round, as a pure state machine: it is told
/// each node's answer to a round's sends, and when the round is over it says what comes next —
/// the call's replies, its error, or which commands go again, where, and whether the slot map
/// is read or a backoff waited first. It does no I/O and reads no clock: ``RedisClusterRouter``
/// writes the sends, waits, reads the map and checks the call's deadline.
///
/// A round's rules, as the cluster specification gives them:
/// - `MOVED` resends to the named node (the slot has a new owner, so the map is read again,
///   meanwhile); `ASK` sends `ASKING` and the command to the named node, once, and leaves the
///   map as it is. At most `maxRedirects` rounds have either.
/// - `TRYAGAIN`, `CLUSTERDOWN` and `LOADING` resend to the slot's owner after a backoff; so do
///   commands whose node refused the connection (they were never written), after the map was
///   read (a replica may have taken over), and after a backoff from their second round.
/// - Commands for every node of a call (`WAIT`, `SCRIPT LOAD`) go again with each resent group,
///   after the commands they followed; their replies merge to the weakest (``merged(_:_:)``).
/// - A failed round trip other than a refused connection, or replies that do not match the
///   commands, fail the call.
struct RedisClusterCall {
    /// What a command still needs after a round.
    enum Pending: Equatable {
        case redirected(RedisClusterRedirect)
        /// Its node refused the connection: it was never written.
        case unreachable(RedisError)

        /// `MOVED` or `ASK` (bounded by `maxRedirects`; waiting out `TRYAGAIN` and unreachable
        /// nodes is bounded by the call's deadline).
        var isRedirect: Bool {
            switch self {
            case .redirected(.moved), .redirected(.ask): true
            case .redirected(.again), .unreachable: false
            }
        }
    }

    /// Where the commands of the next round go, and what comes before they are written.
    struct Resend: Equatable {
        /// Per node an `ASK` named, the commands for it (each after an `ASKING`).
        var asked: [RedisNodeAddress: [Int]] = [:]
        /// Per node a `MOVED` named, the commands for it.
        var moved: [RedisNodeAddress: [Int]] = [:]
        /// Commands for their slot's owner as the slot map says then (empty: none).
        var toOwners: [Int] = []
        var readMap = MapRead.no
        /// Wait the backoff of this attempt first (nil: no wait).
        var backoffAttempt: Int?
        /// The redirects this round followed, for the metrics.
        var asks = 0
        var moves = 0
    }

    enum MapRead: Equatable {
        case no
        /// A `MOVED`: the map is read again for later calls; this one resends at once.
        case meanwhile
        /// An unreachable node: who serves its slots now takes a map read before the resend.
        case first
    }

    enum Next: Equatable {
        /// The call's replies, in order.
        case replies([RESPValue])
        case failed(RedisError)
        case resend(Resend)
    }

    /// Per command: whether it goes to every node the call reaches.
    private let everyNode: [Bool]
    private let maxRedirects: Int
    private var replies: [RESPValue?]
    private var pending: [Int: Pending] = [:]
    private var failure: RedisError?
    /// Rounds resent so far.
    private(set) var round = 0
    private var redirects = 0

    init(everyNode: [Bool], maxRedirects: Int) {
        self.everyNode = everyNode
        self.maxRedirects = maxRedirects
        replies = Array(repeating: nil, count: everyNode.count)
    }

    /// One send's answer: to the commands at `indices` (each after an `ASKING` when `asking`),
    /// from the node at `node`. True when the node counts an error for it (a failed round
    /// trip, or an error reply among its replies), also after the call failed; what the answer
    /// says is then ignored.
    mutating func answered(_ indices: [Int], asking: Bool, from node: RedisNodeAddress,
                           _ answer: Result<[RESPValue], RedisError>) -> Bool {
        let counted = switch answer {
        case .failure: true
        case .success(let replies): replies.contains(where: \.isError)
        }
        guard failure == nil else { return counted }
        let got: [RESPValue]
        switch answer {
        case .failure(let error):
            if case .unavailable = error {
                for index in indices { pending[index] = .unreachable(error) }
            } else {
                failure = error
            }
            return counted
        case .success(let replies):
            got = replies
        }
        let stride = asking ? 2 : 1
        guard got.count == indices.count * stride else {
            failure = .protocolError("\(got.count) replies to \(indices.count * stride) commands")
            return counted
        }
        for (position, index) in indices.enumerated() {
            let reply = got[position * stride + stride - 1]
            if case .error(let message) = reply, let redirect = RedisClusterRedirect(message, asked: node) {
                pending[index] = .redirected(redirect)
            }
            replies[index] = Self.merged(replies[index], reply)
        }
        return counted
    }

    /// Every send of the round answered: what comes next.
    mutating func roundEnded() -> Next {
        if let failure { return .failed(failure) }
        if pending.isEmpty { return .replies(replies.map { $0 ?? .null }) }
        round += 1
        if pending.values.contains(where: \.isRedirect) { redirects += 1 }
        guard redirects <= maxRedirects else { return gaveUp() }
        var resend = Resend()
        var mapChanged = false, unreachable = false, wait = false
        for (index, why) in pending {
            switch why {
            case .redirected(.ask(let address)):
                resend.asks += 1
                resend.asked[address, default: []].append(index)
            case .redirected(.moved(let address)):
                // The named node is the owner whatever the map read next says yet.
                resend.moves += 1
                mapChanged = true
                resend.moved[address, default: []].append(index)
            case .unreachable:
                mapChanged = true
                unreachable = true
                resend.toOwners.append(index)
            case .redirected(.again):
                wait = true
                resend.toOwners.append(index)
            }
        }
        resend.readMap = unreachable ? .first : mapChanged ? .meanwhile : .no
        if wait || (unreachable && round > 1) { resend.backoffAttempt = round - 1 }
        // The call's commands for every node go again with each resent group, after the
        // commands they followed: a `WAIT` answers for the writes on its own node only.
        let everywhere = everyNode.indices.filter { everyNode[$0] && pending[$0] == nil }
        resend.asked = resend.asked.mapValues { ($0 + everywhere).sorted() }
        resend.moved = resend.moved.mapValues { ($0 + everywhere).sorted() }
        if !resend.toOwners.isEmpty { resend.toOwners = (resend.toOwners + everywhere).sorted() }
        return .resend(resend)
    }

    /// The round ``roundEnded()`` planned was written: its commands' replies are the next
    /// round's.
    mutating func resent() {
        for index in pending.keys { replies[index] = nil }
        pending = [:]
    }

    /// No other round (no time left before the call's deadline, or the redirect bound): a
    /// command whose node was unreachable fails the call; else a command still redirected keeps
    /// its error reply.
    func gaveUp() -> Next {
        for case .unreachable(let error) in pending.values { return .failed(error) }
        return .replies(replies.map { $0 ?? .null })
    }

    /// A command's reply, given the one it had (from another node, or an earlier round, for
    /// the commands that go to every node of a call): an error anywhere is its reply, and of
    /// two counts (`WAIT`'s replicas) the smaller, which holds for every node's writes.
    static func merged(_ earlier: RESPValue?, _ reply: RESPValue) -> RESPValue {
        guard let earlier else { return reply }
        if earlier.isError { return earlier }
        if reply.isError { return reply }
        if case .integer(let first) = earlier, case .integer(let second) = reply { return .integer(min(first, second)) }
        return earlier
    }
}

extension RESPValue {
    var isError: Bool {
        if case .error = self { return true }
        return false
    }
}
