import APNs
import Common
@testable import Relay
import Testing

/// One intent's delivery, step by step: the test is the clock (epoch seconds) and the backoff
/// (2ⁿ seconds, no jitter).
@Suite("Delivery state machine", .timeLimit(.minutes(3)))
struct DeliveryStateMachineTests {
    static let now: Int64 = 1_700_000_000

    static func machine(expiration: Int64 = now + 3600, retryBudget: Int64 = 60, canPark: Bool = false) -> DeliveryStateMachine {
        let limits = DeliveryStateMachine.Limits(retryDeadline: now + retryBudget, canPark: canPark,
                                                 parkAfterDeadlineMilliseconds: 30_000)
        return DeliveryStateMachine(expiration: expiration, limits: limits,
                                    backoff: Backoff(base: .seconds(1), maximum: .seconds(3600), jitter: false))
    }

    static func answer(_ status: Int, _ reason: APNsReason? = nil, attempts: Int = 1) -> APNsResult {
        APNsResult(status: status, reason: reason, apnsID: "id", timestamp: status == 410 ? 42 : nil, attempts: attempts)
    }

    static let noAnswer = APNsResult(failure: .connectionLost("reset"), apnsID: "id", attempts: 1)

    @Test func aFinalAnswerFinishesWithIt() {
        for (result, status) in [(Self.answer(200), Outcome.Status.delivered), (Self.answer(400, .badDeviceToken), .rejected),
                                 (Self.answer(410, .unregistered), .unregistered), (Self.answer(403, .invalidProviderToken), .failed)] {
            var machine = Self.machine()
            #expect(machine.attemptDue(now: Self.now, isOwned: true, hasCredentials: true) == .send)
            #expect(machine.answered(result, now: Self.now, nowMilliseconds: Self.now * 1000) == .finish)
            #expect(machine.ending == .answered(status, result))
            #expect(machine.retries == 0)
        }
    }

    @Test func attemptsAddUpTheClientsRequests() {
        var machine = Self.machine()
        _ = machine.answered(Self.answer(503, .serviceUnavailable, attempts: 2), now: Self.now, nowMilliseconds: 0)
        _ = machine.answered(Self.answer(200, attempts: 3), now: Self.now + 1, nowMilliseconds: 0)
        #expect(machine.attempts == 5)
    }

    @Test func retryableAnswersWaitADoublingBackoffThenGiveUpAtTheRetryDeadline() {
        var machine = Self.machine(retryBudget: 10)
        var now = Self.now
        var waits: [Duration] = []
        while case .wait(let delay) = machine.answered(Self.answer(503, .serviceUnavailable), now: now, nowMilliseconds: now * 1000) {
            waits.append(delay)
            now += delay.components.seconds
            #expect(machine.attemptDue(now: now, isOwned: true, hasCredentials: true) == .send)
        }
        // 1 + 2 + 4 = 7 s; the next wait (8 s) would end past the 10 s budget.
        #expect(waits == [.seconds(1), .seconds(2), .seconds(4)])
        #expect(machine.retries == 4)
        let last = Self.answer(503, .serviceUnavailable)
        var ended = machine
        #expect(ended.answered(last, now: now, nowMilliseconds: 0) == .finish)
        #expect(ended.ending == .timedOut(.failed, reason: "RetryDeadline: ServiceUnavailable", last: last))
    }

    @Test func pastTheRetryDeadlineAnIntentThatCanBeParkedWaitsInItsMailbox() {
        var machine = Self.machine(retryBudget: 0, canPark: true)
        #expect(machine.answered(Self.noAnswer, now: Self.now, nowMilliseconds: 5_000)
                == .park(due: 35_000, tooManyRequests: false))
        // The mailbox could not take it: it times out with the last answer's reason.
        #expect(machine.park(succeeded: false, tooManyRequests: false, now: Self.now, nowMilliseconds: 5_000) == .finish)
        #expect(machine.ending == .timedOut(.failed, reason: "RetryDeadline: connection lost before the answer: reset", last: Self.noAnswer))
        #expect(machine.park(succeeded: true, tooManyRequests: false, now: Self.now, nowMilliseconds: 5_000) == .finish)
        #expect(machine.ending == .parked)
    }

    @Test func waitingPastTheExpirationExpires() {
        var machine = Self.machine(expiration: Self.now + 1)
        let result = Self.answer(500, .internalServerError)
        // The first wait (1 s) ends at the expiration: allowed; the second (2 s) would pass it.
        #expect(machine.answered(result, now: Self.now, nowMilliseconds: 0) == .wait(.seconds(1)))
        #expect(machine.answered(result, now: Self.now + 1, nowMilliseconds: 0) == .finish)
        #expect(machine.ending == .timedOut(.expired, reason: "InternalServerError", last: result))
    }

    @Test func anExpiredIntentIsNotSent() {
        var machine = Self.machine(expiration: Self.now + 5)
        #expect(machine.attemptDue(now: Self.now + 6, isOwned: true, hasCredentials: true) == .finish)
        #expect(machine.ending == .ended(.expired, reason: "ExpiredBeforeSending"))
        // After a retryable answer, the reason is that answer's.
        _ = machine.answered(Self.answer(503, .serviceUnavailable), now: Self.now, nowMilliseconds: 0)
        #expect(machine.attemptDue(now: Self.now + 6, isOwned: true, hasCredentials: true) == .finish)
        #expect(machine.ending == .ended(.expired, reason: "ServiceUnavailable"))
    }

    @Test func nowOrNeverGetsOneAttempt() {
        var machine = Self.machine(expiration: 0, canPark: true)
        // Expiration 0 never "passes": the one attempt goes out whenever it is due.
        #expect(machine.attemptDue(now: Self.now + 100_000, isOwned: true, hasCredentials: true) == .send)
        let busy = Self.answer(429, .tooManyRequests)
        #expect(machine.answered(busy, now: Self.now, nowMilliseconds: 0) == .finish)
        #expect(machine.ending == .answered(.expired, busy))
        #expect(machine.retries == 0)
    }

    @Test func tooManyRequestsParksWhereMailboxesExistAndIsRetriedWhereTheyDoNot() {
        var parking = Self.machine(canPark: true)
        let busy = Self.answer(429, .tooManyRequests)
        #expect(parking.answered(busy, now: Self.now, nowMilliseconds: 7_000) == .park(due: 7_000, tooManyRequests: true))
        #expect(parking.retries == 0)
        // A park that failed (Redis failing open): retried like any retryable answer.
        #expect(parking.park(succeeded: false, tooManyRequests: true, now: Self.now, nowMilliseconds: 7_000) == .wait(.seconds(1)))

        var plain = Self.machine(canPark: false)
        #expect(plain.answered(busy, now: Self.now, nowMilliseconds: 0) == .wait(.seconds(1)))
        #expect(plain.retries == 1)
    }

    @Test func nothingSentIsRetriedWithoutCountingAsARetry() {
        var machine = Self.machine()
        #expect(machine.sendFailed("queue full", now: Self.now, nowMilliseconds: 0) == .wait(.seconds(1)))
        #expect(machine.sendFailed("queue full", now: Self.now + 1, nowMilliseconds: 0) == .wait(.seconds(2)))
        #expect(machine.retries == 0)
        #expect(machine.attempts == 0)
        // A wait cut short (past the shutdown deadline) abandons the intent: no outcome.
        #expect(machine.cancelled() == .finish)
        #expect(machine.ending == .abandoned)
    }

    @Test func endsWithoutSendingWhenNotOursOrWithoutCredentialsOrRefused() {
        var machine = Self.machine()
        #expect(machine.attemptDue(now: Self.now, isOwned: false, hasCredentials: true) == .finish)
        #expect(machine.ending == .abandoned)
        #expect(machine.attemptDue(now: Self.now, isOwned: true, hasCredentials: false) == .finish)
        #expect(machine.ending == .ended(.failed, reason: "NoCredentials"))
        #expect(machine.notSent("CredentialFault: InvalidProviderToken") == .finish)
        #expect(machine.ending == .ended(.failed, reason: "CredentialFault: InvalidProviderToken"))
        #expect(machine.invalid(code: "PayloadTooLarge") == .finish)
        #expect(machine.ending == .ended(.rejected, reason: "PayloadTooLarge"))
    }

    @Test func anIntentExpiringWithinTheRetryBudgetTimesOutExpiredNotFailed() {
        var machine = Self.machine(expiration: Self.now + 30, retryBudget: 60)
        #expect(machine.answered(Self.noAnswer, now: Self.now + 30, nowMilliseconds: 0) == .finish)
        #expect(machine.ending == .timedOut(.expired, reason: "connection lost before the answer: reset", last: Self.noAnswer))
    }
}
