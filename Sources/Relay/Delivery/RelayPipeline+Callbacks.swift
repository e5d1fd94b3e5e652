import APNs
import Kafka
import NIOCore
import NIOPosix

/// Intents driven by callbacks instead of a task each (``RelayPipeline/drivesByCallbacks``, on
/// unless `bench e2e --task-per-intent` measures the task per intent against it:
/// docs/performance.md, "A task per intent, or callbacks").
///
/// An intent to send goes this way when its way is an APNs send, its answer's record (with
/// Redis: the dedupe record, written before the outcome goes out) and its outcome: no badge, no
/// Live Activity budget, not taken from a mailbox, no invalidation record, no trace. Its steps
/// are the ones ``RelayPipeline/handle(_:)`` awaits, each started from the callback of the one
/// before: the send's answer (``APNsClient/send(_:completion:)``, handed from the connection's
/// event loop to the item's shard's when they differ), the machine's verdict
/// (``DeliveryStateMachine``), a retry's backoff (a timer on the shard's event loop:
/// ``BackoffTimers``), the record
/// (``RelayPipeline/record(_:_:orElse:then:)``), the outcome's delivery report (librdkafka's
/// poll thread, a poll's reports at a time, each shard's handed to its event loop:
/// ``RelayPipeline/outcomesDelivered(_:)``), the offset
/// and the next intent of its device. The rare turns — a park, a 429 in shadow mode, a record
/// Redis failed, an outcome whose delivery failed — go on in a task, the way the task per intent
/// goes, in a task the shutdown deadline cancels (``inTurnTask(for:_:)``). Past the shutdown
/// deadline (``abandoning``) an intent is abandoned as a task per intent is: one at APNs when
/// its answer comes (or its client closes), one waiting out a backoff at once
/// (``BackoffTimers/abandonAll()``), one due to be sent before it goes.
extension RelayPipeline {
    /// Starts `item` by callbacks; false when it does not qualify (the caller runs it as a task).
    func driveByCallbacks(_ item: WorkItem) -> Bool {
        guard drivesByCallbacks, item.traced == nil, item.mailboxMember == nil,
              configuration.kafka.invalidationsTopic.isEmpty,
              case .send = item.admission, case .success(let intent) = item.intent, intent.badge == nil,
              intent.pushType != .liveactivity || liveActivityPacer == nil,
              let delivery = prepare(item) else { return false }
        drivenByCallbacks.add(1, ordering: .relaxed)
        startRetryBudget(delivery)
        step(delivery, attemptDue(delivery))
        return true
    }

    /// One step of the machine; a send's answer calls the next.
    private func step(_ delivery: Delivery, _ action: DeliveryStateMachine.Action) {
        switch action {
        case .finish:
            ended(delivery)
            settle(delivery)
            concludeByCallbacks(delivery.item, delivery.ending)
        case .send:
            guard let client = delivery.client else { return step(delivery, delivery.machine.cancelled()) }
            let sentAt = ContinuousClock.now
            client.send(delivery.notification) { answer in
                // An answer on another loop's connection (the client found none on the shard's
                // own) goes on on the item's shard's loop, where its shard's state is; its
                // round trip is timed as it came, not as the loop took it.
                let loop = self.shardLoop(of: delivery.item)
                guard loop.inEventLoop else {
                    let answeredAt = ContinuousClock.now
                    return loop.execute { self.answered(answer, delivery, sentAt: sentAt, answeredAt: answeredAt) }
                }
                self.answered(answer, delivery, sentAt: sentAt)
            }
        case .wait(let delay):
            // Waiting to try again, it has nothing at APNs: a revocation need not wait for it.
            leftAPNs(delivery)
            // On its shard's loop, where it runs (an answer, a report's end, a task on its
            // shard's executor), abandoned or not.
            backoffTimers.schedule(in: TimeAmount(delay), on: shardLoop(of: delivery.item)) { abandoned in
                self.step(delivery, abandoned ? delivery.machine.cancelled() : self.attemptDue(delivery))
            }
        case .park:
            driveInTask(delivery, from: action)
        }
    }

    /// A send's answer, on the item's shard's loop: judged, and the next step taken.
    private func answered(_ answer: Result<APNsResult, any Error>, _ delivery: Delivery, sentAt: ContinuousClock.Instant,
                          answeredAt: ContinuousClock.Instant = .now) {
        // Past the shutdown deadline the intent is abandoned, whatever APNs answered, as a task
        // per intent is cancelled at APNs: no outcome, its offset not stored.
        if abandoning.isOpen { return step(delivery, delivery.machine.cancelled()) }
        let action = judge(answer, delivery, sentAt: sentAt, answeredAt: answeredAt)
        if policy != nil, case .success(let result) = answer, result.reason == .tooManyRequests, !isEnforced(delivery.intent) {
            // In shadow mode the device's backoff moves as enforce mode's park would move it.
            return driveInTask(delivery, from: action, first: { await self.noteShadowBackoff(delivery) })
        }
        step(delivery, action)
    }

    /// Drives the delivery on from `action` in a task (``inTurnTask(for:_:)``), `first` done first,
    /// to its outcome and the next intent of its device. Once it parked, its device's queue goes
    /// on in this task (``work(_:parkedUntil:)``): every later send of its app parks behind it,
    /// whatever comes between, as when the task per intent parks.
    private func driveInTask(_ delivery: Delivery, from action: DeliveryStateMachine.Action,
                             first: (@Sendable () async -> Void)? = nil) {
        inTurnTask(for: delivery.item) {
            await first?()
            await self.drive(delivery, from: action)
            self.settle(delivery)
            await self.conclude(delivery.item, delivery.ending)
            guard delivery.ending.parked, let due = delivery.parkedDue else { return self.next(after: delivery.item) }
            let parkedUntil = [delivery.intent.topic: due]
            if let next = self.nextInQueue(after: delivery.item, parkedUntil: parkedUntil) {
                await self.work(next, parkedUntil: parkedUntil)
            }
        }
    }

    /// Records the answer where it is recorded (``records(_:_:dedupe:)``), publishes the outcome
    /// and ends the item once its delivery report is in (no invalidation record, no mailbox
    /// entry: see the extension's conditions). The reports come a poll at a time
    /// (``outcomesDelivered(_:)``). A record Redis failed, or an outcome whose delivery failed,
    /// goes on in a task as ``conclude(_:_:)`` goes.
    private func concludeByCallbacks(_ item: WorkItem, _ ending: Ending) {
        // Its outcome's slot is its shard's loop's (``ShardBox/concluding``): an item ended off
        // it (none is, today: every step runs there) would go on there.
        let loop = shardLoop(of: item)
        guard loop.inEventLoop else { return loop.execute { self.concludeByCallbacks(item, ending) } }
        guard let status = ending.outcome?.status else {
            finish(item, stored: ending.parked, sent: ending.countedAtAPNs)
            return nextInTask(after: item)
        }
        if Self.records(item, status, dedupe: deduplicator != nil) {
            // Its slot is taken here, on its shard's loop, before the record goes to Redis (its
            // callback comes back to this loop, from the group commit's round); a record that
            // failed, or that Redis answered past the shutdown deadline, frees it and goes on in
            // a turn of this loop of its own.
            let slot = outcomeSlot(Concluding(item: item, ending: ending))
            return record(item, ending, orElse: { chained in
                loop.execute {
                    self.freeOutcomeSlot(slot)
                    self.concluded(chained, item, ending)
                }
            }) { key, value, headers in
                self.outcomes.sendBatched(key: key, value: value, headers: headers, slot: slot)
            }
        }
        guard let (key, value) = Self.encoded(ending) else {
            finish(item, stored: false, sent: ending.countedAtAPNs)
            return nextInTask(after: item)
        }
        outcomes.sendBatched(key: key, value: value, headers: Self.outgoingHeaders(item),
                             slot: outcomeSlot(Concluding(item: item, ending: ending)))
    }

    /// An item driven by callbacks whose outcome is on its way to Kafka, kept in its shard's
    /// table under the slot its delivery report names (``outcomeSlot(_:)``, ``OutcomePublisher/sendBatched(key:value:headers:slot:)``).
    struct Concluding: Sendable {
        let item: WorkItem
        let ending: Ending
    }

    /// The delivery reports of outcomes driven by callbacks, as many as one poll of the producer
    /// served (on the thread that polled or flushed, or, for a record refused at once, the one
    /// that sent it): each shard's reports are handed to its event loop (``shardLoop(_:)``),
    /// `endedPerTurn` at a time, one `execute` each, and end there (``endDelivered(_:)``).
    /// There the devices' next intents start, on the loop whose APNs connections the client
    /// prefers, and the shard's table and state are touched by its own loop, the only thread
    /// that may (``ShardBox``), not by the poll thread beside it. What waits on the loops is bounded by the outcomes in flight, which
    /// `limits.max_in_flight` bounds.
    func outcomesDelivered(_ reports: [DeliveryReportBatcher.Report]) {
        for (shard, part) in Self.byShard(reports, shards: shards.count).enumerated() where !part.isEmpty {
            let loop = shardLoop(shard)
            // A poll after a stall may serve tens of thousands: handed over in chunks, each a
            // task of bounded work. The loop runs the chunks back to back, before its next read of its sockets (NIO runs the tasks
            // queued before it turns to I/O): its connections' answers wait until they ended,
            // at most the shard's part of the outcomes in flight (`limits.max_in_flight`).
            for chunk in stride(from: 0, to: part.count, by: Self.endedPerTurn) {
                let reports = part[chunk..<min(chunk + Self.endedPerTurn, part.count)]
                loop.execute { self.endDelivered(reports) }
            }
        }
    }

    /// Reports by the shard their slots name (``outcomeSlot(_:)``), each shard's in their order.
    static func byShard(_ reports: [DeliveryReportBatcher.Report], shards: Int) -> [[DeliveryReportBatcher.Report]] {
        guard shards > 1 else { return [reports] }
        var parts: [[DeliveryReportBatcher.Report]] = Array(repeating: [], count: shards)
        for report in reports { parts[report.slot % shards].append(report) }
        return parts
    }

    /// Ends the items the reports name, one shard's, on its loop: their items are taken from
    /// its table (``concluding(_:)``), the delivered ones end together (one step of its shard,
    /// one offset store: ``finish(_:thenNext:)``), then their devices' next intents start.
    private func endDelivered(_ reports: ArraySlice<DeliveryReportBatcher.Report>) {
        var delivered: [Finished] = []
        delivered.reserveCapacity(reports.count)
        for (concluding, result) in concluding(reports) {
            switch result {
            case .success:
                published(concluding.ending, concluding.item)
                delivered.append(Finished(item: concluding.item, stored: true, sent: concluding.ending.countedAtAPNs))
            case .failure(let error):
                concluded(.notPublished(error), concluding.item, concluding.ending)
            }
        }
        if delivered.isEmpty { return }
        for next in finish(delivered, thenNext: true) where !driveByCallbacks(next) {
            inTurnTask(for: next) { await self.work(next) }
        }
    }

    /// Intents ended in one call of ``finish(_:thenNext:)``, at most (``outcomesDelivered(_:)``).
    static let endedPerTurn = 1024

    /// How an outcome's way went on other than in a delivered batch: a record Redis failed
    /// (recorded with retries, then published, as ``recordAndPublish(_:_:records:)`` goes on), an
    /// outcome whose delivery failed (published with retries), or abandoned. (`published` comes
    /// through ``outcomesDelivered(_:)`` on this path; it ends the item all the same.)
    /// On the item's shard's loop: its ends touch the shard's state.
    private func concluded(_ chained: Chained, _ item: WorkItem, _ ending: Ending) {
        switch chained {
        case .published:
            published(ending, item)
            finish(item, stored: true, sent: ending.countedAtAPNs)
            next(after: item)
        case .notRecorded:
            inTurnTask(for: item) {
                await self.record(item, ending)
                let published = await self.publish(ending, item)
                self.finish(item, stored: published, sent: ending.countedAtAPNs)
                self.next(after: item)
            }
        case .abandoned:
            finish(item, stored: false, sent: ending.countedAtAPNs)
            nextInTask(after: item)
        case .notPublished(let error):
            publishFailed(item, error)
            inTurnTask(for: item) {
                let published = await self.publish(ending, item)
                self.finish(item, stored: published, sent: ending.countedAtAPNs)
                self.next(after: item)
            }
        }
    }

    /// The item's device's next intent, by callbacks when it qualifies, else in a task.
    private func next(after item: WorkItem) {
        guard let next = nextInQueue(after: item, parkedUntil: [:]) else { return }
        if !driveByCallbacks(next) {
            inTurnTask(for: next) { await self.work(next) }
        }
    }

    /// ``next(after:)`` from a task: for an item that ended without waiting for
    /// anything (abandoned past the shutdown deadline or with its partition, unpublishable), so
    /// that a device's queue of such items is not ended by recursion, one stack frame deeper each
    /// (thousands of them overflowed a thread's stack).
    private func nextInTask(after item: WorkItem) {
        inTurnTask(for: item) { self.next(after: item) }
    }

    /// Runs a turn that leaves the callbacks (a park, a 429 in shadow mode, a record or an
    /// outcome whose delivery failed, an intent that does not qualify) in a task of its own,
    /// which the shutdown deadline cancels (``abandoning``) as it cancels the intents' tasks:
    /// what it runs then ends abandoned instead of outliving the relay. The task runs on `item`'s
    /// shard's event loop
    /// (``shardExecutor(of:)``), as the task per intent does: there, where its shard's state is
    /// confined.
    private func inTurnTask(for item: WorkItem, _ turn: @escaping @Sendable () async -> Void) {
        turnsInTasks.add(1, ordering: .relaxed)
        Task(executorPreference: shardExecutor(of: item)) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await turn() }
                group.addTask { await self.abandoning.wait() }
                await group.next()
                group.cancelAll()
            }
        }
    }
}
