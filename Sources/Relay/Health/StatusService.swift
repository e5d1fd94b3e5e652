public import Logging
public import ServiceLifecycle

/// A started ``StatusServer`` as a service: it runs until its group's graceful shutdown reaches
/// it, then closes the server. A group shuts its services down in reverse order, so listed
/// before the relay it keeps answering (`/readyz`: "stopping") while the relay drains. The
/// server is bound before the group starts, so that a port that cannot be served stops the
/// process before the relay has joined its consumer group.
public struct StatusService: Service {
    let server: StatusServer
    let logger: Logger

    public init(server: StatusServer, logger: Logger) {
        self.server = server
        self.logger = logger
    }

    public func run() async throws {
        // Until the group's shutdown reaches this service (or the group is cancelled).
        try? await gracefulShutdown()
        await server.stop()
        logger.info("stopping: status server closed")
    }
}
