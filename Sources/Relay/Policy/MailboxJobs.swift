import Common

/// The mailbox members this relay works on now: parks under way (``RelayPipeline/park(_:due:tooManyRequests:)``)
/// and intents taken from a mailbox, until their work ends. The mailbox poll takes no member
/// found here: a take between two tries of a park would be undone by the second, and an intent
/// already taken is not taken twice.
///
/// Its lock is its own and taken last: the poll claims a member inside the relay-wide lock,
/// with the send slot it reserves for it, so that a member has a slot exactly while it is
/// claimed.
final class MailboxJobs: Sendable {
    private let members = Locked(Set<String>())

    /// Claims `member`; false when it is claimed already.
    func claim(_ member: String) -> Bool {
        members.withLock { $0.insert(member).inserted }
    }

    /// The work on `member` ended (a member not claimed is ignored).
    func end(_ member: String) {
        _ = members.withLock { $0.remove(member) }
    }

    /// Members claimed now.
    var count: Int { members.withLock { $0.count } }
}
