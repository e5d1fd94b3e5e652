import APNs
import Common
import ServiceLifecycle

/// The relay's APNs clients, one per credential and endpoint, opened on first use (nothing
/// connects before an intent needs it). A `Service`: when its group shuts down gracefully it
/// closes every client (requests still open a second later are cut); later requests fail.
final class APNsClientRegistry: Service, Sendable {
    struct Key: Hashable {
        var credential: Int
        var endpoint: APNsEndpoint
    }

    private struct State {
        var clients: [Key: APNsClient] = [:]
        var shutDown = false
    }

    private let state = Locked(State())
    private let make: @Sendable (Key) throws -> APNsClient
    private let closed = AsyncLatch()

    /// - Parameter make: builds the client for a key (no I/O: clients connect on first send).
    init(make: @escaping @Sendable (Key) throws -> APNsClient) {
        self.make = make
    }

    /// The client for `key`, made now if it is the first request for it.
    func client(_ key: Key) throws -> APNsClient {
        try state.withLock { state in
            if let existing = state.clients[key] { return existing }
            guard !state.shutDown else { throw APNsError.shutdown }
            let client = try make(key)
            state.clients[key] = client
            return client
        }
    }

    /// Every client made so far.
    var all: [(key: Key, client: APNsClient)] {
        state.withLock { $0.clients.map { (key: $0.key, client: $0.value) } }
    }

    func run() async {
        await waitForGracefulShutdown(orUntil: closed)
        await shutdown()
    }

    /// Closes every client; no new one is made afterwards.
    func shutdown() async {
        let clients = state.withLock { state -> [APNsClient]? in
            guard !state.shutDown else { return nil }
            state.shutDown = true
            return Array(state.clients.values)
        }
        guard let clients else {
            await closed.wait()
            return
        }
        // The pipeline stopped before: what is still on the wire belongs to intents it
        // abandoned (consumed again), so it gets only a moment.
        await withTaskGroup(of: Void.self) { group in
            for client in clients { group.addTask { await client.shutdown(grace: .seconds(1)) } }
        }
        closed.open()
    }
}

extension RelayPipeline {
    func client(credentialIndex: Int, environment: APNsEnvironment) throws -> APNsClient {
        try clients.client(APNsClientRegistry.Key(credential: credentialIndex, endpoint: try endpoints[environment]!.get()))
    }

    /// Where each environment's intents go: Apple's hosts when `apns.endpoint` is
    /// `production`, else the one endpoint configured.
    static func endpoints(_ configured: String) -> [APNsEnvironment: Result<APNsEndpoint, APNsError>] {
        guard configured != "production" else { return [.production: .success(.production), .development: .success(.development)] }
        let endpoint = Result { () throws(APNsError) in try APNsEndpoint(parsing: configured) }
        return [.production: endpoint, .development: endpoint]
    }
}
