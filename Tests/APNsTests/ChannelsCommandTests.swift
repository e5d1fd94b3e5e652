import APNsSimulator
import Foundation
import TestSupport
import Testing

/// `apns-relay channels` against the simulator's channel management, through the binary:
/// create, list, get, delete, and a refusal's line and exit code.
@Suite("apns-relay channels", .timeLimit(.minutes(2)))
struct ChannelsCommandTests {
    static func lines(_ text: String) throws -> [[String: Any]] {
        try text.split(separator: "\n").map { try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]) }
    }

    @Test func createListGetDeleteThenNotRegistered() async throws {
        let key = TestKey()
        let keyFile = try key.writeP8()
        var configuration = SimulatorConfiguration()
        configuration.signingKeys = [key.simulatorKey]
        let simulator = try await APNsSimulator.start(configuration)
        let common = ["--environment", simulator.url, "--insecure", "--bundle-id", "com.example.live",
                      "--team-id", TestKey.teamID, "--key-id", TestKey.keyID, "--key-file", keyFile]

        let created = try await RelayBinary.run(["channels", "create", "--storage-policy", "1"] + common)
        #expect(created.status == 0, "\(created.stderr)")
        let id = try #require(try Self.lines(created.stdout).first?["channel_id"] as? String)
        #expect(simulator.channels(of: "com.example.live") == [id: 1])

        let listed = try await RelayBinary.run(["channels", "list"] + common)
        let listedIDs = try Self.lines(listed.stdout).compactMap { $0["channel_id"] as? String }
        #expect(listed.status == 0 && listedIDs == [id], "\(listed.stdout)")

        let read = try await RelayBinary.run(["channels", "get", "--channel-id", id] + common)
        let settings = try #require(try Self.lines(read.stdout).first)
        #expect(read.status == 0 && settings["message_storage_policy"] as? Int == 1 && settings["push_type"] as? String == "LiveActivity")

        let deleted = try await RelayBinary.run(["channels", "delete", "--channel-id", id] + common)
        let deletedLine = try Self.lines(deleted.stdout).first
        #expect(deleted.status == 0 && deletedLine?["status"] as? String == "deleted", "\(deleted.stdout)")
        #expect(simulator.channels(of: "com.example.live").isEmpty)

        // APNs' refusal: its status and reason on the line, exit 1.
        let gone = try await RelayBinary.run(["channels", "get", "--channel-id", id] + common)
        let refusal = try #require(try Self.lines(gone.stdout).first)
        #expect(gone.status == 1 && refusal["status"] as? Int == 400 && refusal["reason"] as? String == "ChannelNotRegistered", "\(gone.stdout)")
        // Bad arguments are refused before anything is sent.
        let badPolicy = try await RelayBinary.run(["channels", "create", "--storage-policy", "2"] + common)
        #expect(badPolicy.status == 64, "\(badPolicy.stderr)")
        // No server there: a line that says so, exit 1.
        let nowhere = try await RelayBinary.run(["channels", "list", "--environment", "https://127.0.0.1:9", "--timeout", "1", "--bundle-id", "b",
                                                 "--team-id", TestKey.teamID, "--key-id", TestKey.keyID, "--key-file", keyFile])
        let nowhereLine = try Self.lines(nowhere.stdout).first
        #expect(nowhere.status == 1 && nowhereLine?["status"] as? String == "failed", "\(nowhere.stdout)")
        await simulator.stop()
    }
}
