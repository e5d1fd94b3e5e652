/// Values kept under small integers (their slots) until they are taken back: what a record's
/// delivery report names instead of an object of its own (an integer travels in the record's
/// opaque pointer; an object would be an allocation per record).
///
/// A taken slot is given to the next value (the most recently freed first), so the table is as
/// large as the most values it held at once. Not thread-safe: its owner's lock or loop guards
/// it. `public` and `@inlinable`, so that the relay's uses are specialized for its own element
/// (docs/architecture.md, hot-path rule 4).
public struct SlotTable<Element> {
    @usableFromInline var values: [Element?] = []
    @usableFromInline var freeSlots: [Int] = []

    @inlinable public init() {}

    /// Values held now.
    @inlinable public var count: Int { values.count - freeSlots.count }

    /// Slots the table has, held or free: the most values it held at once.
    @inlinable public var capacity: Int { values.count }

    /// Keeps `value` and returns its slot.
    @inlinable public mutating func insert(_ value: Element) -> Int {
        if let slot = freeSlots.popLast() {
            values[slot] = value
            return slot
        }
        values.append(value)
        return values.count - 1
    }

    /// The value kept under `slot`, which is free again; nil when the slot holds none.
    @inlinable public mutating func remove(_ slot: Int) -> Element? {
        guard values.indices.contains(slot), let value = values[slot] else { return nil }
        values[slot] = nil
        freeSlots.append(slot)
        return value
    }
}
