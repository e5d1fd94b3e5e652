/// A revocation waiting for its partitions' work at APNs, across the shards that own them: the
/// shards whose revoking partitions still have work there, and who waits for the last of them.
/// A value type: the relay's `RevocationCoordinator` keeps it under its lock, and a shard is
/// marked unsettled in a step on that shard's event loop, so that a shard that settles any time
/// later (on that loop) finds its mark.
/// Generic over the waiter (the relay's is the consumer's poll thread's semaphore).
package struct RevocationWait<Waiter> {
    /// Shards with revoking work at APNs, by index.
    package private(set) var unsettled: Set<Int> = []
    /// Who waits for the last of them, once it waits.
    package private(set) var waiter: Waiter?

    package init() {}

    /// A revocation begins: nothing of an earlier one is left.
    package mutating func begin() {
        unsettled.removeAll()
        waiter = nil
    }

    /// Shard `index` has revoking work at APNs.
    package mutating func unsettled(_ index: Int) {
        unsettled.insert(index)
    }

    /// The waiter waits from now on; false (and it does not) when every shard settled already.
    package mutating func wait(_ waiter: Waiter) -> Bool {
        guard !unsettled.isEmpty else { return false }
        self.waiter = waiter
        return true
    }

    /// Shard `index` has no revoking work at APNs left: the waiter to wake when it was the last
    /// one (nil when others remain, nobody waits yet, or the shard was not waited for).
    package mutating func settled(_ index: Int) -> Waiter? {
        guard unsettled.remove(index) != nil, unsettled.isEmpty, let waiter else { return nil }
        self.waiter = nil
        return waiter
    }

    /// The waiter gave up (its bound passed): the revocation goes on without the rest.
    package mutating func gaveUp() {
        begin()
    }
}

extension RevocationWait: Sendable where Waiter: Sendable {}
