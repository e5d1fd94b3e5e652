import Foundation
@testable import Relay
import TestSupport
import Testing

/// Intents driven by callbacks instead of a task each (``RelayPipeline/drivesByCallbacks``, what
/// `bench e2e --callbacks` measures): the same answers, once each, in each device's order, with
/// the turns that leave the callbacks (a retry's backoff) included.
@Suite("Intents driven by callbacks", .stopsItsRelays, .timeLimit(.minutes(3)))
struct CallbackDeliveryTests {
    @Test func everyIntentIsAnsweredOnceInItsDevicesOrder() async throws {
        let gone = hexToken(0xdead)
        // The first three sends are answered 503: those intents wait and are sent again.
        let harness = try await RelayHarness.start(configure: {
            $0.behaviour.unregistered = [gone: 1_432_819_882_000]
            $0.behaviour.failNext = (count: 3, status: 503)
        }, deliveryByCallbacks: true)
        let devices = (1...5).map { hexToken(0xC0 + $0) }
        for round in 0..<4 {
            for device in devices {
                let id = "d\(device.suffix(2))-\(round)"
                try await harness.produce(intent(id, token: device, payload: #"{"aps":{"alert":"\#(id)"}}"#), key: device)
            }
        }
        try await harness.produce(intent("gone-1", token: gone), key: gone)
        try await harness.produce(#"{"id":"broken"#, key: "x")
        let outcomes = PolicyTests.byID(try await harness.outcomes(count: 22))
        #expect(outcomes.count == 22)
        for (id, outcome) in outcomes where id.hasPrefix("d") {
            #expect(outcome["status"] as? String == "delivered", "\(id)")
        }
        #expect(outcomes["gone-1"]?["status"] as? String == "unregistered")
        #expect(outcomes.values.filter { $0["status"] as? String == "invalid" }.count == 1, "the unreadable message")
        #expect(outcomes.values.contains { ($0["attempts"] as? Int ?? 0) > 1 }, "some were sent again after a 503")
        #expect(harness.pipeline.intentsDrivenByCallbacks == 21, "every usable intent")
        // Each device's notifications reached APNs in the order they were produced.
        for device in devices {
            let sent = harness.simulator.accepted.filter { $0.deviceToken == device }
                .map { String(decoding: $0.payload, as: UTF8.self) }
            let expected = (0..<4).map { #"{"aps":{"alert":"d\#(device.suffix(2))-\#($0)"}}"# }
            #expect(sent == expected, "\(device.suffix(2))")
        }
        try await harness.stopExpectingOneOutcomeEach()
    }
}
