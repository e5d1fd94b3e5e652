import CNghttp2

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// nghttp2's memory for one session (`nghttp2_mem`): its small blocks are kept for reuse
/// instead of going back to the system allocator.
///
/// nghttp2 allocates four blocks for every request of a client session and frees them when the
/// stream closes: the stream, the HEADERS frame's outbound item, the copy of the header list
/// (names, values and their `nghttp2_nv`s: 561 bytes for `HTTP2PairTests`' requests, about 800
/// with a provider token), and the DATA frame's item. With `malloc` that was four calls per
/// request, for blocks of a few sizes the next request asks for again (counted through these
/// hooks; `HTTP2PairTests.aConnectionsStreamsReuseNghttp2sMemory` checks that 1,000 requests
/// after a warm-up take fewer than 50 blocks from the system). Here a freed block of at most
/// ``largestKept`` bytes goes on a free list of its size class (16-byte steps) and the next
/// request of that class takes it back; larger blocks (the HPACK tables, frame buffers) go to
/// the system allocator as before.
///
/// Bounded: at most ``keptBytes`` of free blocks per session, past which a freed block goes
/// back to the system. A block kept here is out of reach of the address sanitizer's checks of
/// the system allocator (a use after free inside nghttp2 would not be reported; nghttp2 is not
/// instrumented either way). Not thread-safe, like the session it serves: nghttp2 calls it
/// only from inside the session's calls, on the connection's event loop, and from its
/// `nghttp2_session_del`, after which the allocator is freed with the session's owner; its
/// stored state is `@exclusivity(unchecked)` as the session's is.
final class NGHTTP2Allocator {
    /// The size classes' step and a block's header (which keeps the block's capacity): 16
    /// bytes, so that every block nghttp2 gets is 16-byte aligned, as `malloc`'s are.
    static let step = 16
    /// Blocks up to this many bytes are kept for reuse.
    static let largestKept = 2048
    /// Free blocks kept, in bytes of capacity, at most (all size classes together).
    static let keptBytes = 256 * 1024
    private static let classes = largestKept / step

    /// Per size class, the first free block (its payload; each keeps the next in its first
    /// bytes).
    private let heads: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    /// Bytes of capacity on the free lists now.
    @exclusivity(unchecked) private var kept = 0
    /// Calls nghttp2 made that the system allocator served (`malloc`, `calloc`, `realloc`
    /// that moved a block): for tests. A `realloc` past ``largestKept`` is a new block and a
    /// copy, never a growth in place (nghttp2 grows its buffers rarely: frame and HPACK
    /// buffers, at a session's start or for a larger frame).
    @exclusivity(unchecked) private(set) var systemAllocations = 0

    init() {
        heads = .allocate(capacity: Self.classes)
        heads.initialize(repeating: nil, count: Self.classes)
    }

    deinit {
        for index in 0..<Self.classes {
            var block = heads[index]
            while let payload = block {
                block = payload.load(as: UnsafeMutableRawPointer?.self)
                free(payload - Self.step)
            }
        }
        heads.deallocate()
    }

    /// The payload capacity of a block of `size` bytes: a size class's for a kept size, else
    /// the size itself.
    private static func capacity(for size: Int) -> Int {
        size <= largestKept ? max((size + step - 1) / step, 1) * step : size
    }

    /// A block of at least `size` bytes (16-byte aligned), or nil when the system has none.
    func allocate(_ size: Int) -> UnsafeMutableRawPointer? {
        let capacity = Self.capacity(for: size)
        if capacity <= Self.largestKept, let payload = heads[capacity / Self.step - 1] {
            heads[capacity / Self.step - 1] = payload.load(as: UnsafeMutableRawPointer?.self)
            kept -= capacity
            return payload
        }
        guard let base = malloc(Self.step + capacity) else { return nil }
        systemAllocations += 1
        base.storeBytes(of: capacity, as: Int.self)
        return base + Self.step
    }

    /// Frees a block `allocate` made: kept for reuse when small and within ``keptBytes``.
    func deallocate(_ payload: UnsafeMutableRawPointer?) {
        guard let payload else { return }
        let capacity = (payload - Self.step).load(as: Int.self)
        guard capacity <= Self.largestKept, kept + capacity <= Self.keptBytes else {
            return free(payload - Self.step)
        }
        payload.storeBytes(of: heads[capacity / Self.step - 1], as: UnsafeMutableRawPointer?.self)
        heads[capacity / Self.step - 1] = payload
        kept += capacity
    }

    /// `calloc`: `count` elements of `size` bytes, zeroed; nil on overflow.
    func allocateZeroed(_ count: Int, _ size: Int) -> UnsafeMutableRawPointer? {
        let (total, overflow) = count.multipliedReportingOverflow(by: size)
        guard !overflow, let payload = allocate(total) else { return nil }
        payload.initializeMemory(as: UInt8.self, repeating: 0, count: total)
        return payload
    }

    /// `realloc`: the same block when it has room for `size` bytes, else a new one with the
    /// old one's bytes (and the old one freed); nil (the old one kept) when the system has none.
    func reallocate(_ payload: UnsafeMutableRawPointer?, _ size: Int) -> UnsafeMutableRawPointer? {
        guard let payload else { return allocate(size) }
        let capacity = (payload - Self.step).load(as: Int.self)
        if size <= capacity { return payload }
        guard let moved = allocate(size) else { return nil }
        moved.copyMemory(from: payload, byteCount: capacity)
        deallocate(payload)
        return moved
    }

    /// The `nghttp2_mem` that calls this allocator: valid while it lives (nghttp2 copies the
    /// structure into its session).
    var memory: nghttp2_mem {
        nghttp2_mem(mem_user_data: Unmanaged.passUnretained(self).toOpaque(),
                    malloc: { size, user in allocator(user).allocate(size) },
                    free: { payload, user in allocator(user).deallocate(payload) },
                    calloc: { count, size, user in allocator(user).allocateZeroed(count, size) },
                    realloc: { payload, size, user in allocator(user).reallocate(payload, size) })
    }
}

private func allocator(_ user: UnsafeMutableRawPointer?) -> NGHTTP2Allocator {
    Unmanaged<NGHTTP2Allocator>.fromOpaque(user!).takeUnretainedValue()
}
