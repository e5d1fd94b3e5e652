import Foundation
import TestSupport
import Testing

/// A directory as the kubelet writes a ConfigMap or Secret volume: the files in a timestamped
/// directory, `..data` a link to it, and each file a link through `..data`. An update writes a
/// new timestamped directory, renames a new link over `..data` (one atomic step), then removes
/// the old directory.
struct KubeletVolume {
    let directory: URL
    private var generation = 0

    init(_ files: [String: String]) throws {
        directory = TestFiles.path("volume-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let data = try write(files)
        try FileManager.default.createSymbolicLink(atPath: directory.appendingPathComponent("..data").path, withDestinationPath: data)
        for name in files.keys {
            try FileManager.default.createSymbolicLink(atPath: path(name), withDestinationPath: "..data/\(name)")
        }
    }

    func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

    /// New contents for the same file names.
    mutating func update(_ files: [String: String]) throws {
        let old = try FileManager.default.destinationOfSymbolicLink(atPath: path("..data"))
        let data = try write(files)
        try FileManager.default.createSymbolicLink(atPath: path("..data_tmp"), withDestinationPath: data)
        try #require(rename(path("..data_tmp"), path("..data")) == 0)
        try FileManager.default.removeItem(atPath: path(old))
    }

    private mutating func write(_ files: [String: String]) throws -> String {
        generation += 1
        let name = "..2026_11_23_14_00_0\(generation).\(generation)000"
        let data = directory.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: false)
        for (file, text) in files {
            try text.write(to: data.appendingPathComponent(file), atomically: false, encoding: .utf8)
        }
        return name
    }
}

@Suite("Mounted as Kubernetes mounts them", .timeLimit(.minutes(3)))
struct KubeletVolumeTests {
    /// The chart mounts the ConfigMap and the keys' Secret as directories: an edit of either is a
    /// `..data` swap, which the relay's reload sees through the file's path.
    @Test func aConfigMapOrSecretSwapReachesTheRunningRelay() async throws {
        let harness = try await ProcessHarness.start()
        let port = try freePort()
        let key = try String(contentsOfFile: harness.keyFile, encoding: .utf8)
        var keys = try KubeletVolume(["AuthKey_ABC123DEFG.p8": key])
        let written = try String(contentsOfFile: try writeConfig(harness: harness, httpPort: port), encoding: .utf8)
            .replacingOccurrences(of: "key_file: \(harness.keyFile)", with: "key_file: \(keys.path("AuthKey_ABC123DEFG.p8"))")
        var config = try KubeletVolume(["apns-relay.yaml": written])
        let relay = try RelayProcess.start(config: config.path("apns-relay.yaml"), extraArguments: ["--reload-check-ms", "300"])
        func send(_ id: String, token: Int) async throws {
            let value = #"{"id":"\#(id)","token":"\#(hexToken(token))","topic":"com.example.app","payload":{"aps":{"alert":"x"}}}"#
            _ = try await harness.producer.send(topic: harness.intentsTopic, key: Array(hexToken(token).utf8), value: Array(value.utf8))
        }
        try await CredentialReloadTests.waitForMetric("relay_intents_consumed_total", port: port)
        try await send("before", token: 1)

        // The ConfigMap edited: applied.
        try config.update(["apns-relay.yaml": written.replacingOccurrences(of: "max_in_flight: 10000", with: "max_in_flight: 5000")])
        try await CredentialReloadTests.waitForMetric(#"relay_config_reloads_total{result="applied"} 1"#, port: port)
        try await send("after-config", token: 2)

        // The Secret edited with a broken key: seen through the swapped link, refused, and the
        // key in use stays.
        try keys.update(["AuthKey_ABC123DEFG.p8": "not a key"])
        try await CredentialReloadTests.waitForMetric(#"relay_config_reloads_total{result="invalid"} 1"#, port: port)
        try await send("after-key", token: 3)

        let outcomes = try await harness.outcomes(distinct: 3)
        var status: [String: String] = [:]
        for text in outcomes {
            guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                  let id = object["id"] as? String else { continue }
            status[id] = object["status"] as? String
        }
        #expect(status == ["before": "delivered", "after-config": "delivered", "after-key": "delivered"])
        #expect(await relay.terminate() == 0)
        #expect(relay.printed.contains("AuthKey_ABC123DEFG.p8"), "\(relay.printed.suffix(2000))")
        await harness.simulator.stop()
    }
}
