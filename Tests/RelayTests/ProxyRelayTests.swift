import Foundation
import Relay
import TestSupport
import Testing

/// `apns.proxy` in `run`: the relay's APNs connections tunnel through a real HTTP proxy.
@Suite("The relay behind an HTTP proxy", .stopsItsRelays, .timeLimit(.minutes(2)))
struct ProxyRelayTests {
    @Test func intentsAreDeliveredThroughTheProxy() async throws {
        let proxy = try await TinyproxyProcess.started(basicAuth: ("relay", "s3cret"))
        let harness = try await RelayHarness.start(configureRelay: {
            $0.apns.proxy = "http://relay:s3cret@127.0.0.1:\(proxy.port)"
        })
        for index in 0..<5 { try await harness.produce(intent("via-proxy-\(index)", token: hexToken(index)), key: hexToken(index)) }
        let outcomes = try await harness.outcomes(count: 5)
        #expect(outcomes.allSatisfy { $0["status"] as? String == "delivered" }, "\(outcomes)")
        #expect(proxy.log.contains("CONNECT 127.0.0.1:\(harness.simulator.port) HTTP/1.1"), "\(proxy.log)")
        try await harness.stopExpectingOneOutcomeEach()
    }

    @Test func theProxyIsCheckedAndItsPasswordNeverShown() throws {
        let yaml = "apns: {proxy: \"http://relay:s3cret@proxy.corp:3128\", no_proxy: [.internal, localhost]}"
        let configuration = try RelayConfiguration.load(yaml: yaml, environment: [:])
        #expect(try configuration.apns.parsedProxy()?.host == "proxy.corp")
        #expect(configuration.apns.noProxy == [".internal", "localhost"])
        #expect(configuration.redactedYAML.contains(#"proxy: "http://relay:<redacted>@proxy.corp:3128""#))
        #expect(!configuration.redactedYAML.contains("s3cret"))
        let overridden = try RelayConfiguration.load(yaml: yaml, environment: ["APNS_RELAY_APNS_PROXY": "http://other:8080",
                                                                              "APNS_RELAY_APNS_NO_PROXY": "a.example, b.example"])
        #expect(overridden.apns.proxy == "http://other:8080" && overridden.apns.noProxy == ["a.example", "b.example"])
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "apns: {proxy: \"socks5://u:s3cret@proxy:1080\"}", environment: [:])
        }
        #expect(error.issues.map(\.key) == ["apns.proxy"])
        #expect(!error.description.contains("s3cret"), "\(error)")
        let entries = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: "apns: {no_proxy: [\"10.0.0.0/8\", \"host:443\", ok.example]}", environment: [:])
        }
        #expect(entries.issues.map(\.value) == ["10.0.0.0/8", "host:443"])
    }
}
