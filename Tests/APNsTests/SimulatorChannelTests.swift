import APNs
import APNsSimulator
import Foundation
import HTTP2
import NIOCore
import Testing
import TestSupport

/// The simulator's broadcast push and channel management (the protocol document's "Broadcast
/// push on channels"), over TLS + HTTP/2 with a provider token.
@Suite("Simulator: broadcast channels", .timeLimit(.minutes(1)))
struct SimulatorChannelTests {
    static let bundleID = "com.example.live"
    static let update = #"{"aps":{"event":"update","timestamp":1732000000,"content-state":{"score":"2-1"}}}"#

    /// A simulator with a key, and a raw connection whose requests carry a valid token.
    struct Channels {
        let harness: Harness
        let raw: RawHTTP2Client
        let token: String

        static func start() async throws -> Channels {
            let harness = try await Harness.start()
            return Channels(harness: harness, raw: try await RawHTTP2Client.connect(port: harness.simulator.port),
                            token: try harness.source.currentToken().jwt)
        }

        func send(_ method: String, _ path: String, _ headers: [(String, String)] = [], body: String? = nil) async throws -> HTTP2Response {
            try await raw.execute(HTTP2Request(method: method, authority: "localhost", path: path,
                                               headers: HTTP2Headers([("authorization", "bearer \(token)")] + headers),
                                               body: body.map { ByteBuffer(string: $0) }))
        }

        func create(policy: Int) async throws -> String {
            let created = try await send("POST", "/1/apps/\(SimulatorChannelTests.bundleID)/channels",
                                         body: #"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#)
            #expect(created.status == 201 && created.headers["apns-request-id"] != nil)
            return try #require(created.headers["apns-channel-id"])
        }

        func broadcast(_ channel: String?, bundleID: String = SimulatorChannelTests.bundleID, pushType: String? = "LiveActivity",
                       priority: String? = "10", expiration: String? = "0", body: String? = SimulatorChannelTests.update) async throws -> HTTP2Response {
            var headers: [(String, String)] = []
            if let channel { headers.append(("apns-channel-id", channel)) }
            if let pushType { headers.append(("apns-push-type", pushType)) }
            if let priority { headers.append(("apns-priority", priority)) }
            if let expiration { headers.append(("apns-expiration", expiration)) }
            return try await send("POST", "/4/broadcasts/apps/\(bundleID)", headers, body: body)
        }

        func stop() async {
            await raw.close()
            await harness.stop()
        }
    }

    static func reason(_ response: HTTP2Response) -> String? {
        response.body.flatMap { try? JSONSerialization.jsonObject(with: Data($0.readableBytesView)) as? [String: Any] }?["reason"] as? String
    }

    @Test func createSendReadListDeleteAndSendAgain() async throws {
        let channels = try await Channels.start()
        let stored = try await channels.create(policy: 1)
        #expect(Data(base64Encoded: stored) != nil)
        let sent = try await channels.broadcast(stored, expiration: "1732000000")
        #expect(sent.status == 200 && sent.headers["apns-unique-id"] != nil && sent.headers["apns-request-id"] != nil)
        #expect(channels.harness.simulator.broadcasts.map(\.channelID) == [stored])
        #expect(channels.harness.simulator.broadcasts.first?.uniqueID == sent.headers["apns-unique-id"])

        let read = try await channels.send("GET", "/1/apps/\(Self.bundleID)/channels", [("apns-channel-id", stored)])
        #expect(read.status == 200)
        let settings = try #require(read.body.flatMap { try? JSONSerialization.jsonObject(with: Data($0.readableBytesView)) as? [String: Any] })
        #expect(settings["message-storage-policy"] as? Int == 1 && settings["push-type"] as? String == "LiveActivity")
        let unstored = try await channels.create(policy: 0)
        let listed = try await channels.send("GET", "/1/apps/\(Self.bundleID)/all-channels")
        let ids = try #require(listed.body.flatMap { try? JSONSerialization.jsonObject(with: Data($0.readableBytesView)) as? [String: Any] }?["channels"] as? [String])
        #expect(Set(ids) == [stored, unstored])

        let deleted = try await channels.send("DELETE", "/1/apps/\(Self.bundleID)/channels", [("apns-channel-id", stored)])
        #expect(deleted.status == 204)
        let again = try await channels.broadcast(stored)
        #expect(again.status == 400 && Self.reason(again) == "ChannelNotRegistered")
        #expect(channels.harness.simulator.channels(of: Self.bundleID).keys.sorted() == [unstored])
        await channels.stop()
    }

    @Test func everyBroadcastReasonTheSimulatorGives() async throws {
        let channels = try await Channels.start()
        let unstored = try await channels.create(policy: 0)
        let big = #"{"aps":{"event":"update","timestamp":1,"content-state":{"x":""# + String(repeating: "y", count: 5200) + #""}}}"#
        let cases: [(String, HTTP2Response, Int, String)] = [
            ("suffixed bundle id", try await channels.broadcast(unstored, bundleID: Self.bundleID + ".push-type.liveactivity"), 400, "TopicDisallowed"),
            ("no channel", try await channels.broadcast(nil), 400, "MissingChannelId"),
            ("not base64", try await channels.broadcast("not base64!"), 400, "BadChannelId"),
            ("unknown channel", try await channels.broadcast(Data(repeating: 7, count: 16).base64EncodedString()), 400, "ChannelNotRegistered"),
            ("no push type", try await channels.broadcast(unstored, pushType: nil), 400, "MissingPushType"),
            ("alert push type", try await channels.broadcast(unstored, pushType: "alert"), 400, "InvalidPushType"),
            ("no priority", try await channels.broadcast(unstored, priority: nil), 400, "BadPriority"),
            ("priority 7", try await channels.broadcast(unstored, priority: "7"), 400, "BadPriority"),
            ("no expiration", try await channels.broadcast(unstored, expiration: nil), 400, "BadExpirationDate"),
            ("stored on a no-storage channel", try await channels.broadcast(unstored, expiration: "1732000000"), 400, "BadExpirationDate"),
            ("empty", try await channels.broadcast(unstored, body: ""), 400, "PayloadEmpty"),
            ("too large", try await channels.broadcast(unstored, body: big), 413, "PayloadTooLarge"),
            ("no event", try await channels.broadcast(unstored, body: #"{"aps":{"timestamp":1,"content-state":{}}}"#), 400, "BadRequestPayload"),
            ("GET", try await channels.send("GET", "/4/broadcasts/apps/\(Self.bundleID)"), 405, "MethodNotAllowed"),
            ("bad path", try await channels.send("GET", "/1/apps/\(Self.bundleID)/nothing"), 404, "BadPath"),
            ("read without id", try await channels.send("GET", "/1/apps/\(Self.bundleID)/channels"), 400, "MissingChannelId"),
            ("create without policy", try await channels.send("POST", "/1/apps/\(Self.bundleID)/channels", body: #"{"push-type":"LiveActivity"}"#), 400, "BadRequestPayload"),
            ("PUT", try await channels.send("PUT", "/1/apps/\(Self.bundleID)/channels"), 405, "MethodNotAllowed"),
        ]
        for (what, response, status, reason) in cases {
            #expect(response.status == status && Self.reason(response) == reason, "\(what): \(response.status) \(Self.reason(response) ?? "-")")
        }
        // Push type in any case, priority 5: accepted.
        #expect(try await channels.broadcast(unstored, pushType: "liveactivity", priority: "5").status == 200)
        // Without a provider token: refused as device pushes are.
        let anonymous = try await channels.raw.execute(HTTP2Request(method: "GET", authority: "localhost",
                                                                    path: "/1/apps/\(Self.bundleID)/all-channels"))
        #expect(anonymous.status == 403 && Self.reason(anonymous) == "MissingProviderToken")
        await channels.stop()
    }

    /// The client's own broadcast request: path, headers and the answer's ids as APNs gives them.
    @Test func theClientSendsABroadcastAndReadsItsAnswer() async throws {
        let harness = try await Harness.start()
        let created = try await harness.client.request(method: "POST", path: "/1/apps/\(Self.bundleID)/channels",
                                                       body: Array(#"{"message-storage-policy":0,"push-type":"LiveActivity"}"#.utf8))
        let channel = try #require(created[header: "apns-channel-id"])
        let notification = APNsNotification.broadcast(channelID: channel, bundleID: Self.bundleID, priority: 5, expiration: 0,
                                                      payload: ByteBuffer(string: Self.update))
        let result = try await harness.client.send(notification)
        #expect(result.status == 200 && result.apnsID == APNsIdentifiers.format(notification.apnsID), "\(result)")
        let accepted = try #require(harness.simulator.broadcasts.first)
        #expect(result.uniqueID == accepted.uniqueID && accepted.priority == 5 && accepted.expiration == 0 && accepted.channelID == channel)
        // Refused before a request: what APNs would refuse.
        var suffixed = notification
        suffixed.topic += ".push-type.liveactivity"
        await #expect(throws: APNsError.self) { try await harness.client.send(suffixed) }
        // APNs' refusal of an unknown channel: a rejection with its reason.
        let unknown = APNsNotification.broadcast(channelID: Data(repeating: 7, count: 16).base64EncodedString(), bundleID: Self.bundleID,
                                                 expiration: 0, payload: ByteBuffer(string: Self.update))
        let refused = try await harness.client.send(unknown)
        #expect(refused.status == 400 && refused.reason?.description == "ChannelNotRegistered" && refused.classification == .rejected)
        #expect(harness.simulator.broadcasts.count == 1)
        await harness.stop()
    }
}
