/// What every caller does with an answer; one classification for the whole project.
public enum APNsResultClass: String, Sendable, Equatable {
    /// 200: APNs accepted the notification.
    case delivered
    /// Terminal for this notification (4xx other than the cases below).
    case rejected
    /// 410: the token is dead for this topic; tell upstream, with the timestamp.
    case unregistered
    /// Worth trying again later: 429 TooManyRequests, 5xx, ExpiredProviderToken, no response.
    case retryable
    /// The credentials are at fault (403 other than ExpiredProviderToken, 429
    /// TooManyProviderTokenUpdates): stop sending with them and alert.
    case credentialFault

    /// Classifies an HTTP answer.
    public init(status: Int, reason: APNsReason?) {
        switch (status, reason) {
        case (200, _): self = .delivered
        case (410, _): self = .unregistered
        case (403, .expiredProviderToken?): self = .retryable
        case (403, _): self = .credentialFault
        case (429, .tooManyProviderTokenUpdates?): self = .credentialFault
        case (429, _): self = .retryable
        case (500..., _): self = .retryable
        default: self = .rejected
        }
    }
}

/// Why no APNs answer came back.
public enum APNsTransportFailure: Sendable, Equatable, CustomStringConvertible {
    /// The connection ended after the request went out; APNs may or may not have it.
    case connectionLost(String)
    /// No answer within the request deadline (the stream was cancelled); APNs may have it.
    case timedOut(String)
    /// Never reached APNs (no connection could be made, or it was refused every time we tried).
    case notSent(String)
    /// APNs reset the stream.
    case streamReset(UInt32)
    /// The answer could not be used (a body far larger than APNs ever sends, say).
    case invalidResponse(String)

    public var description: String {
        switch self {
        case .connectionLost(let why): "connection lost before the answer: \(why)"
        case .timedOut(let why): "no answer before the deadline\(why.isEmpty ? "" : ": \(why)")"
        case .notSent(let why): "not sent: \(why)"
        case .streamReset(let code): "stream reset by APNs (HTTP/2 error \(code))"
        case .invalidResponse(let why): "unusable answer: \(why)"
        }
    }
}

/// The result of one send.
public struct APNsResult: Sendable, Equatable {
    /// The HTTP status; nil when no answer came.
    public var status: Int?
    public var reason: APNsReason?
    /// The `apns-id` APNs echoed (or the one we sent when there was no answer).
    public var apnsID: String
    /// 410 only: the last time APNs knew the token was invalid, ms since the epoch.
    public var timestamp: Int64?
    /// `apns-unique-id` of an accepted notification (APNs sends it for broadcasts, and in its
    /// development environment), if any.
    public var uniqueID: String?
    /// Set when no answer came.
    public var failure: APNsTransportFailure?
    /// How many requests went out for this notification (retries after ExpiredProviderToken, or
    /// resends of requests APNs did not process, count too).
    public var attempts: Int
    public var classification: APNsResultClass

    public init(status: Int, reason: APNsReason?, apnsID: String, timestamp: Int64?, attempts: Int) {
        self.status = status
        self.reason = reason
        self.apnsID = apnsID
        self.timestamp = timestamp
        self.failure = nil
        self.attempts = attempts
        self.classification = APNsResultClass(status: status, reason: reason)
    }

    public init(failure: APNsTransportFailure, apnsID: String, attempts: Int) {
        self.status = nil
        self.reason = nil
        self.apnsID = apnsID
        self.timestamp = nil
        self.failure = failure
        self.attempts = attempts
        self.classification = .retryable
    }
}
