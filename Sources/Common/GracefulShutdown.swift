import ServiceLifecycle

/// What a client's `Service.run()` waits for before it closes the client: its service group
/// shutting down gracefully, its task being cancelled, or `closed` opening (someone closed the
/// client directly).
public func waitForGracefulShutdown(orUntil closed: AsyncLatch) async {
    let shutdown = AsyncLatch()
    await withGracefulShutdownHandler {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await shutdown.wait() }
            group.addTask { await closed.wait() }
            await group.next()
            group.cancelAll()
        }
    } onGracefulShutdown: {
        shutdown.open()
    }
}
