import ServiceLifecycle

/// The mailbox deliverer, a service of its own in ``RelayApplication``'s group (with Redis
/// only): every `policy.mailbox_poll_ms` it takes the mailbox entries that became due on the
/// partitions the relay owns and sends them through the pipeline's device queues
/// (``RelayPipeline/deliverMailboxes()``). It stops taking when the pipeline stops consuming;
/// the work it started counts among the pipeline's in flight, which the pipeline drains, and
/// is cancelled with the pipeline's other work at the shutdown deadline.
///
/// Its work runs in a detached task, as the pipeline's does: one that inherits no task-local
/// values (the service group's), which every intent's child task would otherwise link to.
final class MailboxDeliverer: Service {
    let pipeline: RelayPipeline

    init(pipeline: RelayPipeline) {
        self.pipeline = pipeline
    }

    func run() async {
        let pipeline = pipeline
        defer { pipeline.mailboxesEnded.open() }
        await pipeline.runDetached { await pipeline.deliverMailboxes() }
    }
}
