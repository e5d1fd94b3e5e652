import APNsSimulator
import Common
import Foundation
import TestSupport
import Testing
import Spawn

@Suite("apns-relay send and simulate", .timeLimit(.minutes(3)))
struct CommandLineTests {
    static func json(_ text: String) throws -> [String: Any] {
        let line = try #require(text.split(separator: "\n").last)
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }

    @Test func sendDeliversAndPrintsOneJSONObject() async throws {
        let key = TestKey()
        let keyFile = try key.writeP8()
        var configuration = SimulatorConfiguration()
        configuration.signingKeys = [key.simulatorKey]
        configuration.behaviour.unregistered = [token(9): 1_432_819_882_000]
        let simulator = try await APNsSimulator.start(configuration)
        let common = ["send", "--endpoint", simulator.url, "--insecure", "--team-id", TestKey.teamID,
                      "--key-id", TestKey.keyID, "--key-file", keyFile, "--topic", sampleTopic]

        let delivered = try await RelayBinary.run(common + ["--token", sampleToken, "--alert", "hello", "--collapse-id", "c1"])
        #expect(delivered.status == 0, "\(delivered.stderr)")
        let answer = try Self.json(delivered.stdout)
        #expect(answer["status"] as? String == "delivered")
        #expect(answer["http_status"] as? Int == 200)
        #expect(answer["reason"] == nil)
        #expect((answer["apns_id"] as? String)?.count == 36)
        #expect(delivered.stderr.contains("--insecure"))
        #expect(simulator.accepted.first?.collapseID == "c1")

        let gone = try await RelayBinary.run(common + ["--token", token(9), "--alert", "hello"])
        #expect(gone.status == 1)
        let goneAnswer = try Self.json(gone.stdout)
        #expect(goneAnswer["status"] as? String == "unregistered")
        #expect(goneAnswer["http_status"] as? Int == 410)
        #expect(goneAnswer["reason"] as? String == "Unregistered")
        #expect(goneAnswer["timestamp"] as? Int64 == 1_432_819_882_000)

        let invalid = try await RelayBinary.run(common + ["--token", "xyz", "--alert", "hello"])
        #expect(invalid.status == 1)
        let invalidAnswer = try Self.json(invalid.stdout)
        #expect(invalidAnswer["status"] as? String == "rejected")
        #expect(invalidAnswer["reason"] as? String == "BadDeviceToken")
        #expect(simulator.answers.values.reduce(0, +) == 2)  // the invalid one never reached it

        let payloadFile = TestFiles.path("payload-\(UUID()).json").path
        try #"{"aps":{"content-available":1}}"#.write(toFile: payloadFile, atomically: true, encoding: .utf8)
        let background = try await RelayBinary.run(common + ["--token", sampleToken, "--payload", payloadFile,
                                                       "--push-type", "background", "--priority", "5"])
        #expect(background.status == 0, "\(background.stdout) \(background.stderr)")
        #expect(simulator.accepted.last?.pushType == "background")
        await simulator.stop()
    }

    @Test func sendReportsBadInputInOneLine() async throws {
        let missing = try await RelayBinary.run([
            "send", "--endpoint", "https://127.0.0.1:9", "--team-id", "T", "--key-id", "K", "--key-file",
            "/nonexistent/AuthKey.p8", "--topic", sampleTopic, "--token", sampleToken, "--alert", "x",
        ])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("/nonexistent/AuthKey.p8"))
        #expect(missing.stderr.split(separator: "\n").count == 1)
        #expect(try Self.json(missing.stdout)["status"] as? String == "failed")

        let keyFile = try TestKey().writeP8()
        let unreachable = try await RelayBinary.run([
            "send", "--endpoint", "https://127.0.0.1:9", "--team-id", "T", "--key-id", "K", "--key-file", keyFile,
            "--topic", sampleTopic, "--token", sampleToken, "--alert", "x", "--timeout", "2",
        ])
        #expect(unreachable.status == 1)
        let answer = try Self.json(unreachable.stdout)
        #expect(answer["status"] as? String == "failed")
        #expect((answer["error"] as? String)?.lowercased().contains("refused") == true, "\(answer)")

        let badEndpoint = try await RelayBinary.run([
            "send", "--endpoint", "staging", "--team-id", "T", "--key-id", "K", "--key-file", keyFile,
            "--topic", sampleTopic, "--token", sampleToken, "--alert", "x",
        ])
        #expect(badEndpoint.status == 1)
        #expect(badEndpoint.stderr.contains("staging"))
    }

    @Test func simulatePrintsItsURLAndStopsOnSIGTERM() async throws {
        let key = TestKey()
        let keyFile = try key.writeP8()
        let record = TestFiles.path("record-\(UUID()).jsonl").path
        let out = try ChildProcess.makePipe(), err = try ChildProcess.makePipe()
        let process = try ChildProcess(executable: RelayBinary.devURL.path, arguments: [
            "simulate", "--listen", "127.0.0.1:0", "--jwt-key", "\(TestKey.teamID):\(TestKey.keyID):\(keyFile)", "--record", record,
        ], standardOutput: out.write, standardError: err.write)
        close(out.write)
        close(err.write)
        // Killed if the test ends early (a failure below), so it never outlives the test.
        defer { if process.isRunning { process.signal(SIGKILL); _ = process.wait() } }
        // The first line is the contract: read up to it (on a thread of its own: a blocking read).
        let readEnd = out.read
        let firstLine = await onOwnThread { () -> [UInt8] in
            var firstLine: [UInt8] = []
            var byte: UInt8 = 0
            while !firstLine.contains(0x0A), read(readEnd, &byte, 1) == 1 { firstLine.append(byte) }
            return firstLine
        }
        let line = String(decoding: firstLine, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
        #expect(line.hasPrefix("listening on https://127.0.0.1:"))
        let url = String(line.dropFirst("listening on ".count))
        #expect(!url.hasSuffix(":0"))

        let sent = try await RelayBinary.run([
            "send", "--endpoint", url, "--insecure", "--team-id", TestKey.teamID, "--key-id", TestKey.keyID,
            "--key-file", keyFile, "--topic", sampleTopic, "--token", sampleToken, "--alert", "hi",
        ])
        #expect(sent.status == 0, "\(sent.stdout) \(sent.stderr)")

        process.signal(SIGTERM)
        let errorEnd = err.read
        let (status, summaryBytes) = await onOwnThread { (process.wait(), ChildProcess.readToEnd(errorEnd)) }
        #expect(status == 0)
        close(out.read)
        let summary = String(decoding: summaryBytes, as: UTF8.self)
        #expect(summary.contains("200: 1"), "\(summary)")
        let lines = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 1)
        let recorded = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(recorded["token"] as? String == sampleToken)
        #expect(recorded["topic"] as? String == sampleTopic)
        #expect(recorded["payload"] as? String == #"{"aps":{"alert":"hi"}}"#)
        #expect(recorded["apns_id"] as? String == (try Self.json(sent.stdout)["apns_id"] as? String))
    }
}
