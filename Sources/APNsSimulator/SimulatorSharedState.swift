import APNs
import Common
import Crypto
import Foundation
import HTTP2
import NIOCore
import NIOSSL

/// State shared by every connection of one simulator, behind one lock.
final class SharedState: Sendable {
    struct Fields {
        var behaviour: SimulatorConfiguration.Behaviour
        var accepted: [AcceptedNotification] = []
        /// Answers other than 200, by "STATUS Reason".
        var answers: [String: Int] = [:]
        var delivered = 0
        /// Notifications answered 200 that a device would drop (``PushTypePayloads``, or past a
        /// Live Activity budget), by rule.
        var droppedOnDevice: [String: Int] = [:]
        /// Per "<token> <budget>", when the device took pushes that spent a Live Activity budget (ms).
        var liveActivitySpends: [String: [Int64]] = [:]
        var deviceWindows: [String: (start: NIODeadline, count: Int)] = [:]
        var connectionsAccepted = 0
        var peakWhileLimitedToOne = 0
        var peakOverall = 0
        var protocolViolations = 0
        /// Requests reset with REFUSED_STREAM (`refuseNext`), and those whose connection was
        /// closed on them (`dropConnectionOnNext`), by apns-id.
        var refused: [String] = []
        var dropped: [String] = []
        var handlers: [ObjectIdentifier: (NIOLoopBound<HTTP2ServerHandler>, any EventLoop)] = [:]
        /// Broadcast channels per bundle id: channel id → message storage policy.
        var channels: [String: [String: Int]] = [:]
        /// Broadcasts answered 200, in order (when recording in memory).
        var broadcasts: [AcceptedBroadcast] = []
        var recordFile: FileHandle?
        /// Answers kept while `behaviour.holdAnswers` is on, each sending itself on its loop.
        var held: [@Sendable () -> Void] = []
    }

    let keys: [String: SimulatorConfiguration.SigningKey]
    /// Certificate auth: connections present a client certificate whose topics and environment
    /// are checked on every request.
    let certificateAuth: Bool
    let environment: SimulatorConfiguration.Environment
    let tokenMaxAge: Int64
    let maxConcurrentStreams: UInt32
    let recordInMemory: Bool
    /// Whether accepted payloads are kept at all (in memory or in the record file).
    let recordsPayloads: Bool
    let clock: @Sendable () -> Int64
    /// Answers so far (what ``APNsSimulator/answers`` sums), to be waited on.
    let answered = AsyncWatched(0)
    private let mutex: Locked<Fields>

    init(_ configuration: SimulatorConfiguration) throws {
        var keys: [String: SimulatorConfiguration.SigningKey] = [:]
        for key in configuration.signingKeys { keys["\(key.teamID):\(key.keyID)"] = key }
        self.keys = keys
        self.certificateAuth = configuration.clientCertificateTrustRoots != nil
        self.environment = configuration.environment
        self.tokenMaxAge = configuration.tokenMaxAgeSeconds
        self.maxConcurrentStreams = configuration.maxConcurrentStreams
        self.recordInMemory = configuration.recordInMemory
        self.recordsPayloads = configuration.recordInMemory || configuration.recordFile != nil
        self.clock = configuration.clock
        var locked = Fields(behaviour: configuration.behaviour)
        if let path = configuration.recordFile {
            if !FileManager.default.fileExists(atPath: path) {
                _ = FileManager.default.createFile(atPath: path, contents: nil)
            }
            guard let handle = FileHandle(forWritingAtPath: path) else {
                throw SimulatorError.configuration("cannot open record file \(path) for writing")
            }
            handle.seekToEndOfFile()
            locked.recordFile = handle
        }
        self.mutex = Locked(locked)
    }

    func locked<R>(_ body: (inout Fields) throws -> R) rethrows -> R {
        try mutex.withLock { try body(&$0) }
    }

    func register(_ handler: HTTP2ServerHandler, on loop: any EventLoop) {
        let bound = NIOLoopBound(handler, eventLoop: loop)
        locked {
            $0.handlers[ObjectIdentifier(handler)] = (bound, loop)
            $0.connectionsAccepted += 1
        }
    }

    /// Keeps `respond` for `handler` while `behaviour.holdAnswers` is on, and says whether it
    /// did. Decided under the lock ``releaseHeld()`` turns the hold off under, so no answer
    /// is kept after the release.
    func hold(_ respond: @escaping (HTTP2ServerHandler) -> Void, for handler: HTTP2ServerHandler, on loop: any EventLoop) -> Bool {
        let bound = NIOLoopBound((handler, respond), eventLoop: loop)
        return locked {
            guard $0.behaviour.holdAnswers else { return false }
            $0.held.append { loop.execute { bound.value.1(bound.value.0) } }
            return true
        }
    }

    /// Turns the hold off and sends every answer it kept.
    func releaseHeld() {
        let held = locked { state in
            state.behaviour.holdAnswers = false
            defer { state.held = [] }
            return state.held
        }
        for respond in held { respond() }
    }

    func liveHandlers() -> [(NIOLoopBound<HTTP2ServerHandler>, any EventLoop)] {
        locked { Array($0.handlers.values) }
    }

    func closeRecordFile() {
        locked {
            try? $0.recordFile?.close()
            $0.recordFile = nil
        }
    }

    enum Disruption {
        case refuse, dropConnection
    }

    /// The scripted disruption for the next request, if any is left (counted down here).
    func disruption(apnsID: String) -> Disruption? {
        locked { state in
            if state.behaviour.refuseNext > 0 {
                state.behaviour.refuseNext -= 1
                state.refused.append(apnsID)
                return .refuse
            }
            if state.behaviour.dropConnectionOnNext > 0 {
                state.behaviour.dropConnectionOnNext -= 1
                state.dropped.append(apnsID)
                return .dropConnection
            }
            return nil
        }
    }

    /// What a connection needs to know after a request was settled.
    struct Settled {
        var answer: SimulatorAnswer
        var latency: TimeAmount
        var blackHole: Bool
        var holdAnswers: Bool
        var goAwayAfterStreams: Int?
        var goAwayReason: String
    }

    /// Settles one request under one lock: an answer the header checks already found, or else
    /// the device's topic binding and the scripted behaviour; counts the answer and records what
    /// was accepted.
    func settle(_ early: SimulatorAnswer?, openStreams: Int, _ notification: () -> AcceptedNotification) -> Settled {
        defer { answered.update { $0 += 1 } }
        return locked { state in
            state.peakOverall = max(state.peakOverall, openStreams)
            var answer: SimulatorAnswer
            if let early {
                answer = early
            } else {
                let accepted = notification()
                if let topic = state.behaviour.deviceTopics[accepted.deviceToken], topic != accepted.topic {
                    answer = SimulatorAnswer(400, .deviceTokenNotForTopic)
                } else {
                    answer = scripted(&state, token: accepted.deviceToken)
                }
                if answer.status == 200 {
                    state.delivered += 1
                    if let reason = accepted.droppedOnDevice ?? Self.overBudget(&state, accepted) {
                        state.droppedOnDevice[reason, default: 0] += 1
                    }
                    if recordInMemory { state.accepted.append(accepted) }
                    if let file = state.recordFile {
                        // A full disk must not bring the simulator down: the record loses lines.
                        try? file.write(contentsOf: Self.jsonLine(accepted))
                    }
                }
            }
            if answer.status != 200 { state.answers[answer.key, default: 0] += 1 }
            let behaviour = state.behaviour
            return Settled(answer: answer, latency: behaviour.latency, blackHole: behaviour.blackHole, holdAnswers: behaviour.holdAnswers,
                           goAwayAfterStreams: behaviour.goAwayAfterStreams, goAwayReason: behaviour.goAwayReason)
        }
    }

    private func scripted(_ state: inout Fields, token: String) -> SimulatorAnswer {
        if let timestamp = state.behaviour.unregistered[token] {
            return SimulatorAnswer(status: 410, reason: APNsReason.unregistered.description, timestamp: timestamp)
        }
        if let limit = state.behaviour.rateLimitPerDevice {
            let now = NIODeadline.now()
            if state.deviceWindows.count >= 100_000 {
                // Bounded: forget devices whose window has passed.
                let window = state.behaviour.rateLimitWindow
                state.deviceWindows = state.deviceWindows.filter { now - $0.value.start < window }
            }
            var window = state.deviceWindows[token] ?? (now, 0)
            if now - window.start >= state.behaviour.rateLimitWindow { window = (now, 0) }
            window.count += 1
            state.deviceWindows[token] = window
            if window.count > limit { return SimulatorAnswer(429, .tooManyRequests) }
        }
        if state.behaviour.failNext.count > 0 {
            state.behaviour.failNext.count -= 1
            switch state.behaviour.failNext.status {
            case 500: return SimulatorAnswer(500, .internalServerError)
            case 429: return SimulatorAnswer(429, .tooManyRequests)
            default: return SimulatorAnswer(503, .serviceUnavailable)
            }
        }
        if state.behaviour.failureRate > 0, Double.random(in: 0..<1) < state.behaviour.failureRate {
            return Bool.random() ? SimulatorAnswer(500, .internalServerError) : SimulatorAnswer(503, .serviceUnavailable)
        }
        return .ok
    }

    static func jsonLine(_ notification: AcceptedNotification) -> Data {
        var object: [String: Any] = [
            "token": notification.deviceToken, "topic": notification.topic, "apns_id": notification.apnsID,
            "push_type": notification.pushType, "priority": notification.priority,
            "payload": String(decoding: notification.payload, as: UTF8.self), "received_at": notification.receivedAt,
        ]
        if let expiration = notification.expiration { object["expiration"] = expiration }
        if let collapseID = notification.collapseID { object["collapse_id"] = collapseID }
        if let certificate = notification.clientCertificate { object["client_certificate"] = certificate }
        var data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        data.append(0x0A)
        return data
    }
}
