/// Failures of the APNs module that are not an answer from APNs.
public enum APNsError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The notification failed local validation; nothing was sent.
    case invalidNotification(APNsValidationError)
    /// Every stream is busy and the wait queue holds `limit` requests already.
    case queueFull(limit: Int)
    /// The client is shut down.
    case shutdown
    /// A key or certificate file cannot be used.
    case credential(String)
    /// The endpoint text is neither production, development nor https://HOST:PORT.
    case badEndpoint(String)
    /// The proxy text is not http://[user[:password]@]host[:port] (shown with the password redacted).
    case badProxy(String)
    /// A request other than a push got no answer (``APNsClient/request(method:path:headers:body:)``).
    case noAnswer(String)

    public var description: String {
        switch self {
        case .invalidNotification(let error): "invalid notification: \(error)"
        case .queueFull(let limit): "send queue full (\(limit) notifications waiting for a stream)"
        case .shutdown: "the APNs client is shut down"
        case .credential(let why): why
        case .badEndpoint(let text): "endpoint '\(text)' is not production, development or https://HOST:PORT"
        case .badProxy(let text): "proxy '\(text)' is not http://[USER[:PASSWORD]@]HOST[:PORT]"
        case .noAnswer(let why): "no answer: \(why)"
        }
    }
}
