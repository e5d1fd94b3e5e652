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

/// A relay process whose configuration and key are mounted as the chart mounts them.
struct MountedRelay {
    let harness: ProcessHarness
    let port: Int
    /// The configuration as first written.
    let written: String
    var config: KubeletVolume
    var keys: KubeletVolume
    let relay: RelayProcess

    /// Started, and serving its metrics.
    static func start(reloadCheckMilliseconds: Int) async throws -> MountedRelay {
        let harness = try await ProcessHarness.start()
        let port = try await freePort()
        let key = try String(contentsOfFile: harness.keyFile, encoding: .utf8)
        let keys = try KubeletVolume(["AuthKey_ABC123DEFG.p8": key])
        let written = try String(contentsOfFile: try writeConfig(harness: harness, httpPort: port), encoding: .utf8)
            .replacingOccurrences(of: "key_file: \(harness.keyFile)", with: "key_file: \(keys.path("AuthKey_ABC123DEFG.p8"))")
        let config = try KubeletVolume(["apns-relay.yaml": written])
        let relay = try RelayProcess.start(config: config.path("apns-relay.yaml"),
                                           extraArguments: ["--reload-check-ms", "\(reloadCheckMilliseconds)"])
        try await CredentialReloadTests.waitForMetric("apns_relay_intents_consumed_total", port: port)
        return MountedRelay(harness: harness, port: port, written: written, config: config, keys: keys, relay: relay)
    }

    func send(_ id: String, token: Int) async throws {
        let value = #"{"id":"\#(id)","token":"\#(hexToken(token))","topic":"com.example.app","payload":{"aps":{"alert":"x"}}}"#
        _ = try await harness.producer.send(topic: harness.intentsTopic, key: Array(hexToken(token).utf8), value: Array(value.utf8))
    }

    func waitForMetric(_ text: String) async throws {
        try await CredentialReloadTests.waitForMetric(text, port: port)
    }

    /// The ConfigMap edited: `max_in_flight` halved.
    mutating func editConfiguration() throws {
        try config.update(["apns-relay.yaml": written.replacingOccurrences(of: "max_in_flight: 10000", with: "max_in_flight: 5000")])
    }

    /// The Secret edited: the key replaced by one that does not parse.
    mutating func breakKey() throws {
        try keys.update(["AuthKey_ABC123DEFG.p8": "not a key"])
    }
}

@Suite("Mounted as Kubernetes mounts them", .timeLimit(.minutes(3)))
struct KubeletVolumeTests {
    /// The chart mounts the ConfigMap and the keys' Secret as directories: an edit of either is a
    /// `..data` swap, which the relay's reload sees through the file's path.
    @Test func aConfigMapOrSecretSwapReachesTheRunningRelay() async throws {
        var mounted = try await MountedRelay.start(reloadCheckMilliseconds: 300)
        try await mounted.send("before", token: 1)

        // The ConfigMap edited: applied.
        try mounted.editConfiguration()
        try await mounted.waitForMetric(#"apns_relay_config_reloads_total{result="applied"} 1"#)
        try await mounted.send("after-config", token: 2)

        // The Secret edited with a broken key: seen through the swapped link, refused, and the
        // key in use stays.
        try mounted.breakKey()
        try await mounted.waitForMetric(#"apns_relay_config_reloads_total{result="invalid"} 1"#)
        try await mounted.send("after-key", token: 3)

        let outcomes = try await mounted.harness.outcomes(distinct: 3)
        var status: [String: String] = [:]
        for text in outcomes {
            guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                  let id = object["id"] as? String else { continue }
            status[id] = object["status"] as? String
        }
        #expect(status == ["before": "delivered", "after-config": "delivered", "after-key": "delivered"])
        #expect(await mounted.relay.terminate() == 0)
        #expect(mounted.relay.printed.contains("AuthKey_ABC123DEFG.p8"), "\(mounted.relay.printed.suffix(2000))")
        await mounted.harness.simulator.stop()
    }

    /// A reload drains the running relay before the new one starts. A Secret swapped during
    /// that drain (a `helm upgrade` changes both at once) must not reach the new relay
    /// unchecked: it starts with the keys read when the change was validated, and the broken
    /// key is then refused as a change of its own.
    @Test func aSecretSwappedWhileAReloadDrainsIsRefusedAndTheRelayGoesOn() async throws {
        var mounted = try await MountedRelay.start(reloadCheckMilliseconds: 200)
        // One intent held in flight by APNs for 10 s: the reload's drain waits for it (long
        // enough for a loaded machine to get through the steps below meanwhile).
        mounted.harness.simulator.update { $0.latency = .seconds(10) }
        try await mounted.send("held", token: 1)
        let inFlightOne = #"apns_relay_in_flight{lane="\#(mounted.harness.intentsTopic)"} 1.0"#
        try await mounted.waitForMetric(inFlightOne)
        try mounted.editConfiguration()
        try await mounted.waitForMetric(#"apns_relay_config_reloads_total{result="applied"} 1"#)
        // A reload is not a reason to be unready: every pod reloads at once.
        let ready = try await httpGet(port: mounted.port, path: "/readyz")
        #expect(ready.status == 200, "\(ready.body)")
        try mounted.breakKey()
        // The swap landed in the drain: the held intent is still in flight.
        let during = try await httpGet(port: mounted.port, path: "/metrics").body
        #expect(hasMetricLine(during, inFlightOne), "\(during)")
        try await mounted.waitForMetric(#"apns_relay_config_reloads_total{result="invalid"} 1"#)
        // Answers without delay from here on (the held one keeps its 10 s).
        mounted.harness.simulator.update { $0.latency = .zero }
        try await mounted.send("after", token: 2)

        let (ids, _) = try await mounted.harness.outcomeIDs(atLeast: 2, timeout: .seconds(30))
        #expect(ids == ["held", "after"])
        let metrics = try await httpGet(port: mounted.port, path: "/metrics").body
        #expect(metrics.contains(#"apns_relay_config_reloads_total{result="applied"} 1"#), "\(metrics)")
        #expect(await mounted.relay.terminate() == 0)
        #expect(!mounted.relay.printed.contains("cannot start"), "\(mounted.relay.printed.suffix(3000))")
        await mounted.harness.simulator.stop()
    }
}
