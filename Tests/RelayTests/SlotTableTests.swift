@testable import Relay
import Testing

/// The table an outcome's delivery report is named by: a slot holds its value until taken back,
/// once; freed slots are given out again, so the table grows only with the values held at once.
@Suite("Slot table")
struct SlotTableTests {
    @Test func aSlotGivesBackItsValueOnce() {
        var table = SlotTable<String>()
        let a = table.insert("a"), b = table.insert("b")
        #expect(a != b && table.count == 2)
        #expect(table.remove(a) == "a")
        #expect(table.remove(a) == nil, "taken back once")
        #expect(table.remove(99) == nil && table.remove(-1) == nil, "a slot never given holds nothing")
        #expect(table.remove(b) == "b" && table.count == 0)
    }

    @Test func freedSlotsAreReusedSoTheTableStaysAsLargeAsItsMostValues() {
        var table = SlotTable<Int>()
        var held: [Int] = []
        for round in 0..<1000 {
            held.append(table.insert(round))
            if held.count == 8 { for slot in held { _ = table.remove(slot) }; held.removeAll() }
        }
        #expect(table.capacity == 8, "\(table.capacity) slots for 8 values at once")
        let slot = table.insert(-1)
        #expect(slot < 8 && table.remove(slot) == -1)
    }
}
