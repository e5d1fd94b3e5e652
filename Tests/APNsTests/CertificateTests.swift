import APNs
import APNsSimulator
import Foundation
import NIOCore
import NIOSSL
import Testing
import TestSupport

/// APNs client certificates: what the relay reads from one (topics from the subject's UID and
/// Apple's topics extension, environments, validity), the simulator's checks of the certificate
/// a connection presents, and MDM payloads.
@Suite("Certificates and MDM", .timeLimit(.minutes(2)))
struct CertificateTests {
    static let mdmTopic = "com.apple.mgmt.External.3fa85f64-5717-4562-b3fc-2c963f66afa6"

    @Test func topicsComeFromTheUIDAndTheTopicsExtension() throws {
        let authority = try CertificateAuthority()
        let issued = try authority.issue(uid: "com.example.app", team: "TEAM123456",
                                         topics: ["com.example.app", "com.example.app.voip", "com.example.app.complication"],
                                         development: false, production: true)
        let info = try APNsCertificateInfo(issued.chain[0])
        #expect(info.uid == "com.example.app" && info.organizationalUnit == "TEAM123456")
        #expect(info.topics == ["com.example.app", "com.example.app.voip", "com.example.app.complication"])
        #expect(info.production && !info.development)
        #expect(info.subject == "com.example.app")
        // The extension as Apple writes it: each topic followed by a sequence naming its kind.
        let value = try APNsCertificateInfo.topicsExtensionValue(["a.b", "a.b.voip"])
        #expect(APNsCertificateInfo.extensionTopics(value) == ["a.b", "a.b.voip"])
        // Garbage in the extension names no topic; it is not a crash.
        #expect(APNsCertificateInfo.extensionTopics([0x30, 0x05, 0x0C, 0x09]).isEmpty)
        #expect(APNsCertificateInfo.extensionTopics([]).isEmpty)

        let plain = try APNsCertificateInfo(try authority.issue(uid: Self.mdmTopic, development: false, production: false).chain[0])
        #expect(plain.topics == [Self.mdmTopic])
        #expect(plain.development && plain.production, "no marker: either environment")
        let none = try APNsCertificateInfo(try authority.issue(uid: nil, team: nil).chain[0])
        #expect(none.topics.isEmpty && none.uid == nil)
        #expect(throws: APNsError.self) { try APNsCertificateInfo(derEncoded: [1, 2, 3]) }
    }

    /// Apple's certificates carry RSA-2048 keys: one made by openssl, as PEM and as PKCS#12,
    /// reads with its subject's UID and OU, its key is matched to it (another key is refused),
    /// and the simulator takes a push over a connection that presents it.
    @Test func anRSACertificateAsAppleIssuesThem() async throws {
        let directory = TestFiles.path("rsa-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func make(_ name: String, uid: String) throws -> (cert: String, key: String) {
            let cert = directory.appendingPathComponent("\(name).pem").path, key = directory.appendingPathComponent("\(name).key").path
            let made = try runProgram("/usr/bin/openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                                                           "-subj", "/UID=\(uid)/CN=Apple Push Services: \(uid)/OU=TEAMRSA001/O=Example/C=US",
                                                           "-keyout", key, "-out", cert])
            #expect(made.status == 0, "\(made.stderr)")
            return (cert, key)
        }
        let rsa = try make("rsa", uid: sampleTopic), other = try make("other", uid: "com.example.other")
        let identity = try APNsCertificateIdentity(certificateFile: rsa.cert, keyFile: rsa.key)
        #expect(identity.info.uid == sampleTopic && identity.info.organizationalUnit == "TEAMRSA001" && identity.info.topics == [sampleTopic])
        #expect(identity.info.notValidAfter.timeIntervalSinceNow > 29 * 86_400)
        #expect(throws: APNsError.credential("certificate \(rsa.cert): the key does not belong to the certificate")) {
            try APNsCertificateIdentity(certificateFile: rsa.cert, keyFile: other.key)
        }
        // An ECDSA key for an RSA certificate, and the other way round.
        let ecdsa = try CertificateAuthority().issue(uid: sampleTopic)
        let rsaIdentity = try APNsCertificateIdentity(certificateFile: rsa.cert, keyFile: rsa.key)
        #expect(throws: APNsError.credential("the key does not belong to the certificate")) {
            try APNsCertificateIdentity(chain: rsaIdentity.chain, key: ecdsa.key)
        }
        #expect(throws: APNsError.credential("the key does not belong to the certificate")) {
            try APNsCertificateIdentity(chain: ecdsa.chain, key: rsaIdentity.key)
        }
        let p12 = directory.appendingPathComponent("rsa.p12").path
        let exported = try runProgram("/usr/bin/openssl", ["pkcs12", "-export", "-in", rsa.cert, "-inkey", rsa.key, "-out", p12, "-passout", "pass:pw"])
        #expect(exported.status == 0, "\(exported.stderr)")
        #expect(try APNsCertificateIdentity(certificateFile: p12, keyFile: nil, passphrase: "pw").info.uid == sampleTopic)

        var configuration = SimulatorConfiguration()
        configuration.clientCertificateTrustRoots = identity.chain
        let simulator = try await APNsSimulator.start(configuration)
        var clientConfiguration = APNsClientConfiguration(endpoint: APNsEndpoint(host: "127.0.0.1", port: simulator.port),
                                                          credential: .certificate(chain: identity.chain, key: identity.key))
        clientConfiguration.additionalTrustRoots = [simulator.certificate]
        let client = try APNsClient(configuration: clientConfiguration)
        let result: APNsResult
        do {
            result = try await client.send(.alert("x", deviceToken: sampleToken, topic: sampleTopic))
        } catch {
            await client.shutdown()
            await simulator.stop()
            throw error
        }
        await client.shutdown()
        await simulator.stop()
        #expect(result.classification == .delivered, "\(result)")
        #expect(simulator.accepted.first?.clientCertificate == sampleTopic)
    }

    /// A certificate's key is matched by its public half: the issued ECDSA key matches its own
    /// certificate only (P-256 here, P-384 from openssl), a key of no kind APNs uses is named.
    @Test func keysAreMatchedToTheirCertificate() throws {
        let authority = try CertificateAuthority()
        let one = try authority.issue(uid: sampleTopic), two = try authority.issue(uid: sampleTopic)
        #expect(try APNsCertificateIdentity(chain: one.chain, key: one.key).info.uid == sampleTopic)
        #expect(throws: APNsError.credential("the key does not belong to the certificate")) {
            try APNsCertificateIdentity(chain: one.chain, key: two.key)
        }
        let directory = TestFiles.path("keys-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func make(_ name: String, _ newkey: [String]) throws -> (cert: String, key: String) {
            let cert = directory.appendingPathComponent("\(name).pem").path, key = directory.appendingPathComponent("\(name).key").path
            let made = try runProgram("/usr/bin/openssl", ["req", "-x509"] + newkey + ["-nodes", "-days", "30",
                                                           "-subj", "/UID=\(sampleTopic)/CN=\(name)", "-keyout", key, "-out", cert])
            #expect(made.status == 0, "\(made.stderr)")
            return (cert, key)
        }
        let p384 = try make("p384", ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"])
        #expect(try APNsCertificateIdentity(certificateFile: p384.cert, keyFile: p384.key).info.uid == sampleTopic)
        let ed25519 = try make("ed25519", ["-newkey", "ed25519"])
        #expect(throws: APNsError.credential("certificate \(ed25519.cert): the key is neither RSA nor ECDSA on P-256, P-384 or P-521")) {
            try APNsCertificateIdentity(certificateFile: ed25519.cert, keyFile: ed25519.key)
        }
    }

    @Test func mdmPayloadsAreExactlyThePushMagic() throws {
        func validate(_ payload: String, topic: String = Self.mdmTopic) -> String? {
            let notification = APNsNotification(deviceToken: sampleToken, topic: topic, pushType: .mdm, payload: ByteBuffer(string: payload))
            do {
                try notification.validate()
                return nil
            } catch {
                return error.code.rawValue
            }
        }
        #expect(validate(#"{"mdm":"5f1e2d3c-0000-4000-8000-1234567890ab"}"#) == nil)
        #expect(validate(#"{"aps":{},"mdm":"magic"}"#) == "BadPayload")
        #expect(validate(#"{"mdm":1}"#) == "BadPayload")
        #expect(validate(#"{"mdm":"magic","other":1}"#) == "BadPayload")
        #expect(validate(#"{"aps":{"alert":"x"}}"#) == "BadPayload")
        #expect(validate(#"{"mdm":"magic"}"#, topic: "com.example.app") == "BadTopic")
        #expect(validate(#"{"mdm":"magic"}"#, topic: "com.apple.mgmt.External.not-a-uuid") == "BadTopic")
        // Other push types still need aps.
        let alert = APNsNotification(deviceToken: sampleToken, topic: "com.example.app", pushType: .alert,
                                     payload: ByteBuffer(string: #"{"mdm":"magic"}"#))
        #expect(throws: APNsValidationError.self) { try alert.validate() }
    }

    /// Certificate auth from PEM files and from a PKCS#12 bundle; the simulator answers as APNs
    /// does for a topic the certificate does not name (400 TopicDisallowed), a certificate that
    /// names none (403 BadCertificate) and one for the other environment (403
    /// BadCertificateEnvironment).
    @Test func theSimulatorChecksTheClientCertificate() async throws {
        let authority = try CertificateAuthority()
        var configuration = SimulatorConfiguration()
        configuration.clientCertificateTrustRoots = [authority.certificate]
        configuration.environment = .production
        let simulator = try await APNsSimulator.start(configuration)
        let directory = TestFiles.path("cert-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        func write(_ identity: SelfSignedIdentity, _ name: String) throws -> (cert: String, key: String) {
            let cert = directory.appendingPathComponent("\(name).pem").path, key = directory.appendingPathComponent("\(name).key").path
            try identity.writePEM(certificateFile: cert, keyFile: key)
            return (cert, key)
        }
        func send(_ credential: APNsCredential, topic: String, pushType: PushType = .alert,
                  payload: String = #"{"aps":{"alert":"x"}}"#, timeout: Int64 = 10) async throws -> APNsResult {
            var clientConfiguration = APNsClientConfiguration(endpoint: APNsEndpoint(host: "127.0.0.1", port: simulator.port),
                                                              credential: credential)
            clientConfiguration.additionalTrustRoots = [simulator.certificate]
            clientConfiguration.requestTimeout = .seconds(timeout)
            let client = try APNsClient(configuration: clientConfiguration)
            let notification = APNsNotification(deviceToken: sampleToken, topic: topic, pushType: pushType, payload: ByteBuffer(string: payload))
            do {
                let result = try await client.send(notification)
                await client.shutdown()
                return result
            } catch {
                await client.shutdown()
                throw error
            }
        }

        let app = try write(try authority.issue(uid: sampleTopic, topics: [sampleTopic, sampleTopic + ".voip"]), "app")
        let p12 = directory.appendingPathComponent("app.p12").path
        let openssl = try runProgram("/usr/bin/openssl", ["pkcs12", "-export", "-in", app.cert, "-inkey", app.key,
                                                          "-out", p12, "-passout", "pass:secret"])
        #expect(openssl.status == 0, "\(openssl.stderr)")
        for credential in [
            try APNsCredential.certificate(certificateFile: app.cert, keyFile: app.key),
            try APNsCredential.certificate(certificateFile: p12, keyFile: nil, passphrase: "secret"),
        ] {
            #expect(try await send(credential, topic: sampleTopic).classification == .delivered)
            #expect(try await send(credential, topic: sampleTopic + ".voip", pushType: .voip).classification == .delivered)
            let other = try await send(credential, topic: "com.example.other")
            #expect(other.status == 400 && other.reason == .topicDisallowed, "\(other)")
        }
        #expect(simulator.accepted.count == 4)
        #expect(simulator.accepted.allSatisfy { $0.clientCertificate == sampleTopic })

        let nameless = try write(try authority.issue(uid: nil), "nameless")
        let refused = try await send(try .certificate(certificateFile: nameless.cert, keyFile: nameless.key), topic: sampleTopic)
        #expect(refused.status == 403 && refused.reason == .badCertificate, "\(refused)")

        let sandbox = try write(try authority.issue(uid: sampleTopic, development: true, production: false), "sandbox")
        let wrong = try await send(try .certificate(certificateFile: sandbox.cert, keyFile: sandbox.key), topic: sampleTopic)
        #expect(wrong.status == 403 && wrong.reason == .badCertificateEnvironment, "\(wrong)")

        let mdm = try write(try authority.issue(uid: Self.mdmTopic), "mdm")
        let pushed = try await send(try .certificate(certificateFile: mdm.cert, keyFile: mdm.key), topic: Self.mdmTopic,
                                    pushType: .mdm, payload: #"{"mdm":"5f1e2d3c-0000-4000-8000-1234567890ab"}"#)
        #expect(pushed.classification == .delivered, "\(pushed)")
        #expect(simulator.accepted.last?.pushType == "mdm" && simulator.accepted.last?.clientCertificate == Self.mdmTopic)
        #expect(simulator.accepted.count == 5)

        // A certificate the simulator's authority did not issue fails the handshake: nothing is sent.
        let stranger = try write(try CertificateAuthority().issue(uid: sampleTopic), "stranger")
        let unknown = try await send(try .certificate(certificateFile: stranger.cert, keyFile: stranger.key), topic: sampleTopic, timeout: 1)
        #expect(unknown.classification == .retryable)
        // So does a connection without a client certificate.
        let anonymous = try await send(.token(try LocalProviderTokenSource(signer: TestKey().signer)), topic: sampleTopic, timeout: 1)
        #expect(anonymous.classification == .retryable)
        #expect(simulator.accepted.count == 5)
        #expect(throws: APNsError.self) { try APNsCredential.certificate(certificateFile: p12, keyFile: nil, passphrase: "wrong") }
        await simulator.stop()
    }
}
