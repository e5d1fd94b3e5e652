/// A function that one thread sets (or replaces) and others call: a callback registered after
/// its caller was made.
///
/// Not a `Locked<(@Sendable (…) -> Void)?>`: `Mutex.withLock` lends its value as `inout`, and a
/// function value lent so is reabstracted on the way in and again on the way out — wrapped in
/// two more thunks that stay stored, even when the closure only read it. Every read would make
/// every later call two frames deeper, without bound (a handler read after each producer poll;
/// docs/performance.md has what that cost). Here the function sits in an object that the lock
/// holds, so reading it copies a reference.
public final class LockedFunction<Function: Sendable>: Sendable {
    private final class Box: Sendable {
        let function: Function
        init(_ function: Function) { self.function = function }
    }

    private let box: Locked<Box?>

    public init(_ function: Function? = nil) {
        box = Locked(function.map(Box.init))
    }

    /// The function set last, nil when none is (or it was cleared).
    public var current: Function? {
        box.withLock { $0 }?.function
    }

    /// Sets (or replaces, or with nil clears) the function.
    public func set(_ function: Function?) {
        let new = function.map(Box.init)
        box.withLock { $0 = new }
    }
}
