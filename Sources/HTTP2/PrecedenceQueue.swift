import NIOCore

/// Requests waiting for a stream: a higher ``HTTP2Request/precedence`` starts first, equal ones
/// in the order they came — except that every ``oldestEvery``-th one taken is the oldest
/// waiting whatever its precedence, so lower precedences never starve while higher ones keep
/// every stream busy (about that share of the streams that free up; a request taken and found
/// cancelled uses its turn).
/// One ring buffer per level, so appending and taking stay O(1).
struct PrecedenceQueue<Element> {
    /// Precedences above this one count as it.
    static var highest: Int { 3 }

    /// One start in this many goes to the oldest request waiting.
    static var oldestEvery: Int { 8 }

    private var levels: [CircularBuffer<(sequence: UInt64, element: Element)>] = Array(repeating: CircularBuffer(), count: highest + 1)
    private(set) var count = 0
    private var appended: UInt64 = 0
    private var popped = 0

    var isEmpty: Bool { count == 0 }

    mutating func append(_ element: Element, precedence: Int) {
        levels[min(max(precedence, 0), Self.highest)].append((appended, element))
        appended &+= 1
        count += 1
    }

    /// The next element to start: the oldest of the highest precedence waiting, or every
    /// ``oldestEvery``-th time the oldest of all.
    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        popped &+= 1
        var chosen: Int?
        if popped % Self.oldestEvery == 0 {
            for level in levels.indices where !levels[level].isEmpty {
                if chosen == nil || levels[level].first!.sequence < levels[chosen!].first!.sequence { chosen = level }
            }
        } else {
            chosen = levels.indices.last { !levels[$0].isEmpty }
        }
        guard let chosen else { return nil }
        count -= 1
        return levels[chosen].removeFirst().element
    }

    func contains(where predicate: (Element) -> Bool) -> Bool {
        levels.contains { $0.contains { predicate($0.element) } }
    }

    /// Keeps the elements `keep` answers true for, in their order.
    mutating func filter(_ keep: (Element) -> Bool) {
        for level in levels.indices where levels[level].contains(where: { !keep($0.element) }) {
            var kept = CircularBuffer<(sequence: UInt64, element: Element)>(initialCapacity: levels[level].count)
            for entry in levels[level] where keep(entry.element) { kept.append(entry) }
            count -= levels[level].count - kept.count
            levels[level] = kept
        }
    }
}
