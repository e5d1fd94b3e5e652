@testable import Relay
import Testing

/// A mailbox member is worked on once at a time here (``MailboxJobs``).
@Suite("Mailbox jobs")
struct MailboxJobsTests {
    @Test func aMemberIsClaimedOnceUntilItsWorkEnds() {
        let jobs = MailboxJobs()
        #expect(jobs.claim("a"))
        #expect(!jobs.claim("a"), "claimed already")
        #expect(jobs.claim("b"))
        #expect(jobs.count == 2)
        jobs.end("a")
        jobs.end("never claimed")
        #expect(jobs.count == 1)
        #expect(jobs.claim("a"), "its work ended: it may be claimed again")
    }
}
