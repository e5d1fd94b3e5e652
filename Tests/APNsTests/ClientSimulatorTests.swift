import APNs
import APNsSimulator
import Foundation
import NIOCore
import Testing

@Suite("Client against the simulator over TLS and HTTP/2")
struct ClientSimulatorTests {
    @Test func deliversAndEchoesTheAPNsID() async throws {
        let harness = try await Harness.start()
        let notification = APNsNotification.alert("hello", deviceToken: sampleToken, topic: sampleTopic)
        let result = try await harness.client.send(notification)
        #expect(result.classification == .delivered)
        #expect(result.status == 200)
        #expect(result.apnsID == notification.apnsID.uuidString.lowercased())
        let accepted = harness.simulator.accepted
        #expect(accepted.count == 1)
        #expect(accepted.first?.deviceToken == sampleToken)
        #expect(accepted.first?.topic == sampleTopic)
        #expect(accepted.first.map { String(decoding: $0.payload, as: UTF8.self) } == #"{"aps":{"alert":"hello"}}"#)
        await harness.stop()
    }
}
