import APNs

extension RelayPipeline {
    struct ClientKey: Hashable {
        var credential: Int
        var endpoint: APNsEndpoint
    }

    func client(credentialIndex: Int, environment: APNsEnvironment) throws -> APNsClient {
        let key = ClientKey(credential: credentialIndex, endpoint: try endpoints[environment]!.get())
        return try clients.withLock { clients in
            if let existing = clients[key] { return existing }
            var settings = APNsClientConfiguration(endpoint: key.endpoint, credential: .token(tokenSources[credentialIndex]))
            settings.connections = configuration.apns.connections
            settings.insecureSkipVerify = configuration.apns.insecureSkipVerify
            settings.requestTimeout = .seconds(Int64(configuration.apns.requestTimeoutSeconds))
            settings.maxQueuedNotifications = max(configuration.limits.maxInFlight, 1000)
            let client = try APNsClient(configuration: settings, logger: logger)
            clients[key] = client
            return client
        }
    }

    /// Where each environment's intents go: Apple's hosts when `apns.endpoint` is
    /// `production`, else the one endpoint configured.
    static func endpoints(_ configured: String) -> [APNsEnvironment: Result<APNsEndpoint, APNsError>] {
        guard configured != "production" else { return [.production: .success(.production), .development: .success(.development)] }
        let endpoint = Result { () throws(APNsError) in try APNsEndpoint(parsing: configured) }
        return [.production: endpoint, .development: endpoint]
    }
}
