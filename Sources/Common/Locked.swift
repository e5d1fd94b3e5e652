public import Synchronization

#if TSAN_VISIBLE_LOCKS
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The project's lock around a value: `Synchronization.Mutex` itself, except in thread-sanitizer
/// builds (`scripts/test --sanitize=thread` defines `TSAN_VISIBLE_LOCKS`), where this wrapper
/// tells the sanitizer about each section. `Mutex` locks with a futex the sanitizer does not
/// see, so every value two threads take turns on under one looked like a data race to it.
///
/// Each section acquires, and ends by releasing, a sync address of the lock's own (the
/// sanitizer's `__tsan_acquire` / `__tsan_release`), which orders one section before the next.
public struct Locked<Value: ~Copyable>: ~Copyable, Sendable {
    private let mutex: Mutex<Value>
    private let syncAddress = SanitizerSyncAddress()

    public init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
    }

    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            syncAddress.acquire()
            defer { syncAddress.release() }
            return try body(&value)
        }
    }
}

/// An address only one lock uses, announced to the thread sanitizer around its sections.
private final class SanitizerSyncAddress: Sendable {
    private typealias Annotation = @convention(c) (UnsafeMutableRawPointer?) -> Void

    /// The sanitizer runtime's annotations, from the running binary (nil without the sanitizer).
    private static let annotations: (acquire: Annotation, release: Annotation)? = {
        guard let acquire = dlsym(nil, "__tsan_acquire"), let release = dlsym(nil, "__tsan_release")
        else { return nil }
        return (unsafeBitCast(acquire, to: Annotation.self), unsafeBitCast(release, to: Annotation.self))
    }()

    private var address: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    func acquire() { Self.annotations?.acquire(address) }
    func release() { Self.annotations?.release(address) }
}
#else
/// The project's lock around a value: `Synchronization.Mutex` (in thread-sanitizer builds, a
/// wrapper the sanitizer can see; the other definition, above, says why).
public typealias Locked<Value: ~Copyable> = Mutex<Value>
#endif
