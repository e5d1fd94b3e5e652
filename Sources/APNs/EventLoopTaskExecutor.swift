public import NIOCore

/// Runs Swift tasks on a NIO event loop.
///
/// A task that prefers this executor (`withTaskExecutorPreference`, `addTask(executorPreference:)`)
/// runs on the same thread as the connections of that loop: its `send` reaches the connection
/// without a thread hop and its answer resumes it without waking another thread. The client
/// offers one per event loop (``APNsClient/taskExecutors``).
public final class EventLoopTaskExecutor: TaskExecutor {
    public let eventLoop: any EventLoop

    public init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
        }
    }
}
