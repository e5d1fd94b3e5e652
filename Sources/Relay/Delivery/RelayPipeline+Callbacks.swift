import APNs
import Kafka

/// Intents driven by callbacks instead of a task each (``RelayPipeline/drivesByCallbacks``, on
/// unless `bench e2e --task-per-intent` measures the task per intent against it:
/// docs/performance.md, "A task per intent, or callbacks").
///
/// Only an intent whose whole way is an APNs send and its outcome goes this way: no Redis (no
/// dedupe record, park, badge or mailbox), no invalidation record, no trace. Its steps are the
/// ones ``RelayPipeline/handle(_:)`` awaits, each started from the callback of the one before:
/// the send's answer (``APNsClient/send(_:completion:)``, on the connection's event loop), the
/// machine's verdict (``DeliveryStateMachine``), the outcome's delivery report (librdkafka's
/// poll thread), the offset and the next intent of its device. The rare turns — a retry's
/// backoff, an outcome whose delivery failed — go on in a task, the way the task per intent
/// goes, in a task the shutdown deadline cancels (``inTurnTask(_:)``). Past the shutdown
/// deadline (``abandoning``) an intent is abandoned as a task per intent is: one at APNs when
/// its answer comes (or its client closes), one due to be sent before it goes.
extension RelayPipeline {
    /// Starts `item` by callbacks; false when it does not qualify (the caller runs it as a task).
    func driveByCallbacks(_ item: WorkItem) -> Bool {
        guard drivesByCallbacks, policy == nil, item.traced == nil, item.mailboxMember == nil,
              configuration.kafka.invalidationsTopic.isEmpty,
              case .send = item.admission, case .success(let intent) = item.intent, intent.badge == nil,
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
            Self.settle(delivery)
            concludeByCallbacks(delivery.item, delivery.ending)
        case .send:
            guard let client = delivery.client else { return step(delivery, delivery.machine.cancelled()) }
            let sentAt = ContinuousClock.now
            client.send(delivery.notification) { answer in
                // Past the shutdown deadline the intent is abandoned, whatever APNs answered,
                // as a task per intent is cancelled at APNs: no outcome, its offset not stored.
                if self.abandoning.isOpen { return self.step(delivery, delivery.machine.cancelled()) }
                self.step(delivery, self.judge(answer, delivery, sentAt: sentAt))
            }
        case .wait, .park:
            inTurnTask {
                await self.drive(delivery, from: action)
                Self.settle(delivery)
                await self.conclude(delivery.item, delivery.ending)
                self.next(after: delivery.item)
            }
        }
    }

    /// Publishes the outcome (no dedupe record, no invalidation record: see the extension's
    /// conditions) and ends the item once its delivery report is in.
    private func concludeByCallbacks(_ item: WorkItem, _ ending: Ending) {
        guard let (key, value) = Self.encoded(ending) else {
            finish(item, stored: ending.parked, sent: ending.countedAtAPNs)
            return next(after: item)
        }
        producer.send(topic: configuration.kafka.outcomesTopic, key: key, value: value, headers: Self.outgoingHeaders(item)) { report in
            switch report {
            case .success:
                self.published(ending, item)
                self.finish(item, stored: true, sent: ending.countedAtAPNs)
                self.next(after: item)
            case .failure(let error):
                self.publishFailed(item, error)
                self.inTurnTask {
                    let published = await self.publish(ending, item)
                    self.finish(item, stored: published, sent: ending.countedAtAPNs)
                    self.next(after: item)
                }
            }
        }
    }

    /// The item's device's next intent, by callbacks when it qualifies, else in a task.
    private func next(after item: WorkItem) {
        guard let next = nextInQueue(after: item, parkedUntil: [:]) else { return }
        if !driveByCallbacks(next) {
            inTurnTask { await self.work(next) }
        }
    }

    /// Runs a turn that leaves the callbacks (a retry's backoff, an outcome whose delivery
    /// failed, an intent that does not qualify) in a task of its own, which the shutdown
    /// deadline cancels (``abandoning``) as it cancels the intents' tasks: what it runs then
    /// ends abandoned instead of outliving the relay.
    private func inTurnTask(_ turn: @escaping @Sendable () async -> Void) {
        Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await turn() }
                group.addTask { await self.abandoning.wait() }
                await group.next()
                group.cancelAll()
            }
        }
    }
}
