public import Logging
public import Prometheus
public import ServiceLifecycle

/// The status endpoints (``StatusServer``) as a service: bound when it runs, closed when its
/// group's graceful shutdown reaches it. A group shuts its services down in reverse order, so
/// listed before the relay it keeps answering (`/readyz`: "stopping") while the relay drains.
public struct StatusService: Service {
    let host: String
    let port: Int
    let limits: StatusServer.Limits
    let registry: PrometheusCollectorRegistry
    let status: any RelayStatus
    let logger: Logger
    let bound: @Sendable (Int) -> Void

    /// - Parameter bound: called with the port once the server listens.
    public init(host: String = "0.0.0.0", port: Int, limits: StatusServer.Limits = StatusServer.Limits(),
                registry: PrometheusCollectorRegistry, status: any RelayStatus,
                logger: Logger, bound: @escaping @Sendable (Int) -> Void = { _ in }) {
        self.host = host
        self.port = port
        self.limits = limits
        self.registry = registry
        self.status = status
        self.logger = logger
        self.bound = bound
    }

    /// The port could not be served.
    public struct BindError: Error, CustomStringConvertible {
        public var address: String
        public var port: Int
        public var reason: String
        public var description: String { "cannot serve http.port \(port) on \(address): \(reason)" }
    }

    public func run() async throws {
        let server: StatusServer
        do {
            server = try await StatusServer.start(host: host, port: port, registry: registry, status: status, limits: limits)
        } catch {
            throw BindError(address: host, port: port, reason: "\(error)")
        }
        logger.info("serving /metrics, /healthz, /readyz", metadata: ["http.address": "\(host)", "http.port": "\(server.port)"])
        bound(server.port)
        // Until the group's shutdown reaches this service (or the group is cancelled).
        try? await gracefulShutdown()
        await server.stop()
        logger.info("stopping: status server closed")
    }
}
