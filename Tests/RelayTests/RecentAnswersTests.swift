@testable import Relay
import Testing

/// Which answers a batch's admission read of Redis may have missed (``RecentAnswers``), and that
/// only the reads under way keep answers.
@Suite("Recent answers")
struct RecentAnswersTests {
    @Test func aReadMissesTheAnswersRecordedAfterItBegan() {
        var answers = RecentAnswers<String>()
        answers.answered("before")
        let first = answers.readBegan()
        answers.answered("a")
        let second = answers.readBegan()
        answers.answered("b")
        #expect(answers.answered("a", since: first))
        #expect(!answers.answered("a", since: second), "recorded before the second read began: it saw it")
        #expect(answers.answered("b", since: first) && answers.answered("b", since: second))
        #expect(!answers.answered("before", since: first), "recorded before any read: not kept, and not missed")
        #expect(answers.held == 2)
        answers.readEnded(first)
        #expect(answers.held == 1, "no read under way began before a's answer")
        #expect(answers.answered("b", since: second))
        answers.readEnded(second)
        #expect(answers.held == 0)
        answers.answered("after")
        #expect(answers.held == 0, "no read under way: nothing kept")
    }

    /// A key answered again keeps its latest answer when the earlier one goes; two reads that
    /// began at one mark end one at a time; a mark that is not under way ends nothing.
    @Test func theLatestAnswerAndEveryReadCount() {
        var answers = RecentAnswers<String>()
        let first = answers.readBegan()
        let twin = answers.readBegan()
        #expect(first == twin)
        answers.answered("a")
        let later = answers.readBegan()
        answers.answered("a")
        answers.readEnded(first)
        answers.readEnded(12345)
        #expect(answers.answered("a", since: twin), "the twin read is still under way")
        answers.readEnded(twin)
        #expect(answers.answered("a", since: later), "its second answer came after the later read began")
        #expect(answers.held == 1)
        answers.readEnded(later)
        #expect(answers.held == 0)
    }

    /// Past its capacity the oldest answers go, and a read that began before one of them counts
    /// as having missed every key.
    @Test func pastItsCapacityAnOldReadMissesEverything() {
        var answers = RecentAnswers<String>(capacity: 2)
        let old = answers.readBegan()
        answers.answered("a")
        let newer = answers.readBegan()
        answers.answered("b")
        answers.answered("c")
        #expect(answers.held == 2)
        #expect(answers.answered("unrelated", since: old), "a's answer was let go: the old read may have missed anything")
        #expect(!answers.answered("unrelated", since: newer))
        #expect(answers.answered("c", since: newer))
    }
}
