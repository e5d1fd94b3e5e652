import NIOCore

/// Requests waiting for a stream: a higher ``HTTP2Request/precedence`` starts first, equal ones
/// in the order they came. One ring buffer per level, so appending and taking stay O(1).
struct PrecedenceQueue<Element> {
    /// Precedences above this one count as it.
    static var highest: Int { 3 }

    private var levels: [CircularBuffer<Element>] = Array(repeating: CircularBuffer(), count: highest + 1)
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    mutating func append(_ element: Element, precedence: Int) {
        levels[min(max(precedence, 0), Self.highest)].append(element)
        count += 1
    }

    /// The next element to start: the oldest of the highest precedence waiting.
    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        for level in stride(from: Self.highest, through: 0, by: -1) where !levels[level].isEmpty {
            count -= 1
            return levels[level].removeFirst()
        }
        return nil
    }

    func contains(where predicate: (Element) -> Bool) -> Bool {
        levels.contains { $0.contains(where: predicate) }
    }

    /// Keeps the elements `keep` answers true for, in their order.
    mutating func filter(_ keep: (Element) -> Bool) {
        for level in levels.indices where levels[level].contains(where: { !keep($0) }) {
            var kept = CircularBuffer<Element>(initialCapacity: levels[level].count)
            for element in levels[level] where keep(element) { kept.append(element) }
            count -= levels[level].count - kept.count
            levels[level] = kept
        }
    }
}
