package import APNsCore
package import Common

/// One intent's delivery across its attempts, as a pure state machine: events in (an attempt is
/// due, APNs answered, a send failed, a wait or a park failed), actions out (send, wait, park,
/// finish, with the ending in ``ending``). No I/O and no clock of its own: times come with the
/// events (epoch seconds, and epoch milliseconds for mailbox due times); the backoff is given
/// (tests turn its jitter off).
///
/// - An attempt goes out while the intent is still ours, has credentials and has not expired.
/// - A final answer (200, 4xx, 410, a credential fault) finishes the delivery with that answer.
/// - A retryable answer (429, 5xx, no answer) waits a backoff and tries again, until waiting
///   would pass the intent's expiration (it expires) or the retry deadline (with mailboxes it is
///   parked until after the longest backoff; without, it fails `RetryDeadline`). Expiration 0
///   means one attempt. A 429 with mailboxes parks the intent (its device backs off).
package struct DeliveryStateMachine: Sendable {
    /// Small on purpose: the async frame that drives the machine holds one for every intent in
    /// flight (the ending, larger, stays in the machine).
    package enum Action: Sendable, Equatable {
        /// Send the notification now.
        case send
        /// Ask again (``attemptDue(now:isOwned:hasCredentials:)``) after this wait.
        case wait(Duration)
        /// Park the intent in its device's mailbox until `due` (epoch ms).
        case park(due: Int64, tooManyRequests: Bool)
        /// Done: ``ending`` says how.
        case finish
    }

    /// How the delivery ended.
    package enum Ending: Sendable, Equatable {
        /// Its partition is no longer ours (or the relay stops): no outcome.
        case abandoned
        /// In its device's mailbox: the mailbox answers it later.
        case parked
        /// With APNs' answer (or its absence, for a now-or-never intent).
        case answered(Outcome.Status, APNsResult)
        /// Without a usable answer: the status and the reason.
        case ended(Outcome.Status, reason: String)
        /// Out of time (expiration or retry deadline) after retryable answers: the last one, if
        /// any came, gives the outcome its HTTP status and apns-id.
        case timedOut(Outcome.Status, reason: String, last: APNsResult?)
    }

    package struct Limits: Sendable {
        /// Past this (epoch s) retryable answers stop being retried (set when the first attempt
        /// is due).
        package var retryDeadline: Int64
        /// Whether the intent can be parked in a mailbox (the policy runs, with Redis).
        package var canPark: Bool
        /// Past the retry deadline, a parked intent is tried again this much later.
        package var parkAfterDeadlineMilliseconds: Int64

        package init(retryDeadline: Int64, canPark: Bool, parkAfterDeadlineMilliseconds: Int64) {
            self.retryDeadline = retryDeadline
            self.canPark = canPark
            self.parkAfterDeadlineMilliseconds = parkAfterDeadlineMilliseconds
        }
    }

    /// Epoch seconds; 0 is now-or-never (one attempt).
    package let expiration: Int64
    package var limits: Limits
    /// The waits between attempts.
    package let backoff: Backoff
    /// Requests that went out (APNs client retries and resends included).
    package private(set) var attempts = 0
    /// Retryable answers that were retried or timed out (`apns_relay_retries_total`).
    package private(set) var retries = 0
    /// Why the last attempt did not get a final answer.
    package private(set) var lastReason: String?
    private var lastResult: APNsResult?
    private var backoffs = 0
    /// How the delivery ended, once an action was ``Action/finish``.
    package private(set) var ending: Ending?

    package init(expiration: Int64, limits: Limits, backoff: Backoff) {
        self.expiration = expiration
        self.limits = limits
        self.backoff = backoff
    }

    /// An attempt is due at `now` (epoch s): send, or finish when the intent is no longer ours,
    /// has no credentials or expired meanwhile.
    package mutating func attemptDue(now: Int64, isOwned: Bool, hasCredentials: Bool) -> Action {
        guard isOwned else { return finish(.abandoned) }
        guard hasCredentials else { return finish(.ended(.failed, reason: "NoCredentials")) }
        if expiration != 0, now > expiration {
            return finish(.ended(.expired, reason: lastReason ?? "ExpiredBeforeSending"))
        }
        return .send
    }

    /// The send could not start: its team's credentials are in a fault cool-down, or no client
    /// could be made (`reason` says which).
    package mutating func notSent(_ reason: String) -> Action {
        finish(.ended(.failed, reason: reason))
    }

    /// APNs refused the notification before sending it (the client's own validation).
    package mutating func invalid(code: String) -> Action {
        finish(.ended(.rejected, reason: code))
    }

    /// Nothing was sent (the client's queue is full, or it shuts down): wait and try again.
    package mutating func sendFailed(_ reason: String, now: Int64, nowMilliseconds: Int64) -> Action {
        lastReason = reason
        return retryOrGiveUp(now: now, nowMilliseconds: nowMilliseconds)
    }

    /// APNs answered (or the client gave up on an answer) at `now`.
    package mutating func answered(_ result: APNsResult, now: Int64, nowMilliseconds: Int64) -> Action {
        attempts += result.attempts
        switch result.classification {
        case .delivered: return finish(.answered(.delivered, result))
        case .rejected: return finish(.answered(.rejected, result))
        case .unregistered: return finish(.answered(.unregistered, result))
        case .credentialFault: return finish(.answered(.failed, result))
        case .retryable:
            lastReason = result.reason?.description ?? result.failure.map { "\($0)" }
            lastResult = result
            // Now or never: one try.
            if expiration == 0 { return finish(.answered(.expired, result)) }
            if result.reason == .tooManyRequests, limits.canPark {
                // Too fast for this device: it backs off in Redis and the intent waits in its mailbox.
                return .park(due: nowMilliseconds, tooManyRequests: true)
            }
            retries += 1
            return retryOrGiveUp(now: now, nowMilliseconds: nowMilliseconds)
        }
    }

    /// The work was cancelled during a backoff wait or a send: the relay abandons it (past its
    /// shutdown deadline). No outcome: the intent's offset stays uncommitted and it is consumed
    /// again.
    package mutating func cancelled() -> Action {
        finish(.abandoned)
    }

    /// The mailbox took the intent (or could not: Redis failing with `fail_open`, the partition
    /// gone meanwhile). A 429 that could not be parked is retried like any retryable answer; an
    /// intent past the retry budget that could not be parked times out.
    package mutating func park(succeeded: Bool, tooManyRequests: Bool, now: Int64, nowMilliseconds: Int64) -> Action {
        if succeeded { return finish(.parked) }
        return tooManyRequests ? retryOrGiveUp(now: now, nowMilliseconds: nowMilliseconds) : finish(timeout())
    }

    private mutating func finish(_ ending: Ending) -> Action {
        self.ending = ending
        return .finish
    }

    /// The next backoff, or the end when waiting it would pass the expiration or the retry
    /// deadline.
    private mutating func retryOrGiveUp(now: Int64, nowMilliseconds: Int64) -> Action {
        let delay = backoff.delay(attempt: backoffs)
        backoffs += 1
        let resumeAt = now + delay.components.seconds
        if resumeAt > expiration { return finish(timeout()) }
        if resumeAt > limits.retryDeadline {
            // APNs unavailable past the retry budget: with mailboxes the intent waits in its
            // mailbox (tried again after the longest backoff) instead of failing.
            guard limits.canPark else { return finish(timeout()) }
            return .park(due: nowMilliseconds + limits.parkAfterDeadlineMilliseconds, tooManyRequests: false)
        }
        return .wait(delay)
    }

    private func timeout() -> Ending {
        let expired = expiration <= limits.retryDeadline
        return .timedOut(expired ? .expired : .failed,
                         reason: expired ? (lastReason ?? "Expired") : "RetryDeadline: \(lastReason ?? "no answer")",
                         last: lastResult)
    }
}
