@testable import HTTP2
import Testing

/// nghttp2's per-session memory: small blocks come back from their size class's free list,
/// bounded in bytes; `realloc` keeps a block's bytes; `calloc` zeroes and refuses an overflow.
@Suite("nghttp2 allocator")
struct NGHTTP2AllocatorTests {
    @Test func aFreedSmallBlockIsGivenToTheNextOfItsSizeClass() throws {
        let allocator = NGHTTP2Allocator()
        let first = try #require(allocator.allocate(100))
        #expect(Int(bitPattern: first) % 16 == 0, "aligned as malloc's")
        allocator.deallocate(first)
        let again = try #require(allocator.allocate(112))
        #expect(again == first, "100 and 112 bytes are one size class")
        let other = try #require(allocator.allocate(113))
        #expect(other != first && allocator.systemAllocations == 2)
        allocator.deallocate(again)
        allocator.deallocate(other)
    }

    @Test func freeBlocksAreKeptUpToTheBoundThenReturned() throws {
        let allocator = NGHTTP2Allocator()
        let size = NGHTTP2Allocator.largestKept
        let count = NGHTTP2Allocator.keptBytes / size + 10
        let blocks = try (0..<count).map { _ in try #require(allocator.allocate(size)) }
        for block in blocks { allocator.deallocate(block) }
        // Only the bound's worth came back to the lists: as many again take that many from them
        // and the rest from the system.
        let before = allocator.systemAllocations
        let again = try (0..<count).map { _ in try #require(allocator.allocate(size)) }
        #expect(allocator.systemAllocations - before == 10)
        for block in again { allocator.deallocate(block) }
        // A block past the largest kept size always goes to and from the system.
        let large = try #require(allocator.allocate(size + 1))
        allocator.deallocate(large)
        let largeAgain = try #require(allocator.allocate(size + 1))
        #expect(allocator.systemAllocations - before == 12)
        allocator.deallocate(largeAgain)
    }

    @Test func reallocKeepsTheBytesAndCallocZeroesAndRefusesOverflow() throws {
        let allocator = NGHTTP2Allocator()
        let block = try #require(allocator.allocate(20))
        for index in 0..<20 { block.storeBytes(of: UInt8(index), toByteOffset: index, as: UInt8.self) }
        #expect(allocator.reallocate(block, 32) == block, "room in its size class: the same block")
        let moved = try #require(allocator.reallocate(block, 3000))
        #expect(moved != block)
        #expect((0..<20).allSatisfy { moved.load(fromByteOffset: $0, as: UInt8.self) == UInt8($0) })
        allocator.deallocate(moved)
        // The freed small block is reused: calloc hands it out zeroed.
        let zeroed = try #require(allocator.allocateZeroed(4, 8))
        #expect(zeroed == block && (0..<32).allSatisfy { zeroed.load(fromByteOffset: $0, as: UInt8.self) == 0 })
        allocator.deallocate(zeroed)
        #expect(allocator.allocateZeroed(Int.max, 2) == nil)
        allocator.deallocate(nil)
    }
}
