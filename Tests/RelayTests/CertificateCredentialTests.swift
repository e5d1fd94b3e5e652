import APNs
import APNsSimulator
import Crypto
import Foundation
@testable import Relay
import Testing
import TestSupport

/// Certificate credentials in `apns.credentials` (PEM or PKCS#12, topics from the certificate
/// when left out, mixed with token credentials), their expiry checks, and MDM pushes, which go
/// out only with a certificate.
@Suite("Certificate credentials and MDM", .stopsItsRelays, .timeLimit(.minutes(3)))
struct CertificateCredentialTests {
    static let mdmTopic = "com.apple.mgmt.External.3fa85f64-5717-4562-b3fc-2c963f66afa6"
    static let tokenMDMTopic = "com.apple.mgmt.External.11111111-2222-4333-8444-555555555555"

    /// Certificate files in a directory of their own.
    struct Files {
        let directory: URL

        init() throws {
            directory = TestFiles.path("certs-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }

        /// PEM certificate and key.
        func pem(_ identity: SelfSignedIdentity, _ name: String) throws -> (cert: String, key: String) {
            let cert = directory.appendingPathComponent("\(name).pem").path, key = directory.appendingPathComponent("\(name).key").path
            try identity.writePEM(certificateFile: cert, keyFile: key)
            return (cert, key)
        }

        /// A PKCS#12 bundle with `passphrase`.
        func p12(_ identity: SelfSignedIdentity, _ name: String, passphrase: String) throws -> String {
            let (cert, key) = try pem(identity, name)
            let bundle = directory.appendingPathComponent("\(name).p12").path
            let openssl = try runProgram("/usr/bin/openssl", ["pkcs12", "-export", "-in", cert, "-inkey", key, "-out", bundle,
                                                              "-passout", "pass:\(passphrase)"])
            guard openssl.status == 0 else { throw APNsError.credential(openssl.stderr) }
            return bundle
        }

        func p8() throws -> String {
            let path = directory.appendingPathComponent("AuthKey.p8").path
            try P256.Signing.PrivateKey().pemRepresentation.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
    }

    @Test func certificateCredentialsSitBesideTokenOnesAndNameTheirOwnTopics() throws {
        let authority = try CertificateAuthority(), files = try Files()
        let app = try files.pem(try authority.issue(uid: "com.example.cert", team: "TEAMCERT01",
                                                    topics: ["com.example.cert", "com.example.cert.voip"]), "app")
        let mdm = try files.p12(try authority.issue(uid: Self.mdmTopic), "mdm", passphrase: "s3cret")
        let yaml = """
            apns:
              credentials:
                - {team_id: TEAM123456, key_id: ABC123DEFG, key_file: \(try files.p8()), topics: [com.example.app]}
                - {cert_file: \(app.cert), key_file: \(app.key)}
                - {cert_file: \(mdm), passphrase_env: MDM_P12_PASSPHRASE}
            """
        let configuration = try RelayConfiguration.load(yaml: yaml)
        #expect(configuration.apns.credentials[1] == .init(certificateFile: app.cert, keyFile: app.key))
        #expect(configuration.apns.credentials[2] == .init(certificateFile: mdm, passphraseEnvironment: "MDM_P12_PASSPHRASE"))
        let checked = configuration.preflight(environment: ["MDM_P12_PASSPHRASE": "s3cret"])
        #expect(checked.problems.isEmpty, "\(checked.problems)")
        #expect(checked.warnings.isEmpty, "\(checked.warnings)")
        #expect(checked.credentials.map(\.isCertificate) == [false, true, true])
        // A certificate's faults are its own: they cool down neither the team's keys nor its
        // other certificates.
        #expect(checked.credentials.map(\.team) == ["TEAM123456", "com.example.cert", Self.mdmTopic])
        let topics = RelayConfiguration.effectiveTopics(configuration.apns.credentials, checked.credentials)
        #expect(topics == [["com.example.app"], ["com.example.cert", "com.example.cert.voip"], [Self.mdmTopic]])
        let directory = CredentialDirectory(topics: topics, exact: checked.credentials.map(\.isCertificate))
        #expect(directory.index(forTopic: "com.example.cert.voip") == 1 && directory.index(forTopic: Self.mdmTopic) == 2)
        // A key covers every push type of its apps; a certificate only the topics it names.
        #expect(directory.index(forTopic: "com.example.app.voip") == 0)
        #expect(directory.index(forTopic: "com.example.cert.push-type.liveactivity") == nil)

        // The passphrase comes from the variable only: unset, or wrong, the credential is a problem.
        let unset = configuration.preflight(environment: [:])
        #expect(unset.problems.count == 1 && unset.problems[0].contains("MDM_P12_PASSPHRASE"), "\(unset.problems)")
        #expect(unset.credentials.isEmpty)
        let wrong = configuration.preflight(environment: ["MDM_P12_PASSPHRASE": "nope"])
        #expect(wrong.problems.count == 1 && wrong.problems[0].hasPrefix("apns.credentials[2].cert_file"), "\(wrong.problems)")

        // check-config's output reads back as the same configuration, no passphrase in it.
        let printed = configuration.redactedYAML
        #expect(!printed.contains("s3cret"))
        let again = try RelayConfiguration.load(yaml: printed)
        #expect(again.apns.credentials == configuration.apns.credentials)
    }

    @Test func aTopicClaimedTwiceAcrossKindsIsRefused() throws {
        let authority = try CertificateAuthority(), files = try Files()
        let app = try files.pem(try authority.issue(uid: "com.example.app"), "app")
        let configuration = try RelayConfiguration.load(yaml: """
            apns:
              credentials:
                - {team_id: TEAM123456, key_id: ABC123DEFG, key_file: \(try files.p8()), topics: [com.example.app]}
                - {cert_file: \(app.cert), key_file: \(app.key)}
            policy:
              topics:
                com.example.nobody: {dedupe_window_seconds: 60}
            """)
        let problems = configuration.preflight().problems
        #expect(problems.contains("apns.credentials[1].topics: com.example.app is claimed by apns.credentials[0] too"), "\(problems)")
        #expect(problems.contains { $0.hasPrefix("policy.topics.com.example.nobody") }, "\(problems)")
        #expect(problems.count == 2, "\(problems)")
    }

    @Test func anExpiredCertificateFailsAndOneExpiringWithin30DaysWarns() throws {
        let authority = try CertificateAuthority(), files = try Files()
        let now = Date()
        func check(expiresIn days: Double, from start: Date? = nil) throws -> PreflightResult {
            let identity = try authority.issue(uid: "com.example.app", notValidBefore: start ?? now.addingTimeInterval(-86_400 * 400),
                                               notValidAfter: now.addingTimeInterval(days * 86_400))
            let cert = try files.pem(identity, "app-\(days)")
            let configuration = try RelayConfiguration.load(yaml: """
                apns:
                  credentials:
                    - {cert_file: \(cert.cert), key_file: \(cert.key), topics: [com.example.app]}
                """)
            return configuration.preflight(now: now)
        }
        let fine = try check(expiresIn: 31)
        #expect(fine.problems.isEmpty && fine.warnings.isEmpty, "\(fine)")
        let soon = try check(expiresIn: 10.5)
        #expect(soon.problems.isEmpty)
        #expect(soon.warnings.count == 1 && soon.warnings[0].contains("in 10 days"), "\(soon.warnings)")
        // Unusable, not a problem: run goes on without it (check-config fails on it).
        let expired = try check(expiresIn: -1)
        #expect(expired.problems.isEmpty && expired.credentials.count == 1, "\(expired.problems)")
        #expect(expired.unusable.count == 1 && expired.unusable[0].contains("expired"), "\(expired.unusable)")
        let early = try check(expiresIn: 300, from: now.addingTimeInterval(86_400))
        #expect(early.unusable.count == 1 && early.unusable[0].contains("not valid before"), "\(early.unusable)")
        // A key that is not the certificate's is refused before anything connects.
        let one = try files.pem(try authority.issue(uid: "com.example.app"), "one")
        let other = try files.pem(try authority.issue(uid: "com.example.app"), "other")
        let mismatched = try RelayConfiguration.load(yaml: """
            apns:
              credentials:
                - {cert_file: \(one.cert), key_file: \(other.key)}
            """).preflight().problems
        #expect(mismatched.count == 1 && mismatched[0].contains("the key does not belong to the certificate"), "\(mismatched)")
        // A certificate that names no topic needs its topics listed.
        let nameless = try files.pem(try authority.issue(uid: nil), "nameless")
        let configuration = try RelayConfiguration.load(yaml: """
            apns:
              credentials:
                - {cert_file: \(nameless.cert), key_file: \(nameless.key)}
            """)
        #expect(configuration.preflight().problems == ["apns.credentials[0].topics: the certificate names no topic (no subject UID, no topics extension): list its topics"])
    }

    @Test func certificateEntriesAreCheckedLikeTheOthers() throws {
        let error = try #require(throws: ConfigurationError.self) {
            try RelayConfiguration.load(yaml: """
                apns:
                  credentials:
                    - {cert_file: /nonexistent/cert.pem, team_id: TEAM123456, passphrase_env: "my secret", topics: []}
                """)
        }
        let keys = Set(error.issues.map(\.key))
        #expect(keys == ["apns.credentials[0].team_id", "apns.credentials[0].cert_file", "apns.credentials[0].passphrase_env",
                         "apns.credentials[0].topics"], "\(error)")
        #expect(!"\(error)".contains("my secret"), "the would-be passphrase is shown: \(error)")
    }

    /// What a certificate credential refuses before sending, where APNs would refuse it (or
    /// count it as the credential's fault): an expired or not yet valid certificate, another
    /// environment than the certificate's; and an MDM push without a certificate.
    @Test func aCertificateRefusesWhatAPNsWouldRefuse() throws {
        let authority = try CertificateAuthority()
        let info = try APNsCertificateInfo(try authority.issue(uid: "com.example.app", development: false, production: true,
                                                               notValidBefore: Date(timeIntervalSince1970: 1_000),
                                                               notValidAfter: Date(timeIntervalSince1970: 2_000)).chain[0])
        func intent(_ extra: String, topic: String = "com.example.app", payload: String = #"{"aps":{}}"#) throws -> Intent {
            try Intent.parse(Array(#"{"id":"i","token":"\#(hexToken(1))","topic":"\#(topic)","payload":\#(payload)\#(extra)}"#.utf8),
                             key: nil, now: 1_500, defaultTTL: 60)
        }
        let production = try intent("")
        #expect(RelayPipeline.certificateRefusal(info, production, now: 1_500) == nil)
        #expect(RelayPipeline.certificateRefusal(info, production, now: 2_000)?.hasPrefix("CertificateExpired: ") == true)
        #expect(RelayPipeline.certificateRefusal(info, production, now: 999)?.hasPrefix("CertificateNotYetValid: ") == true)
        let sandbox = try intent(#","environment":"development""#)
        #expect(RelayPipeline.certificateRefusal(info, sandbox, now: 1_500)?.hasPrefix("BadCertificateEnvironment: ") == true)
        #expect(RelayPipeline.certificateRefusal(nil, sandbox, now: 1_500) == nil, "a token goes anywhere")
        let mdm = try intent(#","push_type":"mdm""#, topic: Self.mdmTopic, payload: #"{"mdm":"magic"}"#)
        #expect(RelayPipeline.certificateRefusal(nil, mdm, now: 1_500)?.hasPrefix("MDMNeedsCertificate: ") == true)
        // MDM goes to production only.
        #expect(throws: InvalidIntent.self) { try intent(#","push_type":"mdm","environment":"development""#, topic: Self.mdmTopic, payload: #"{"mdm":"m"}"#) }
    }

    /// Through the relay: intents for a certificate credential's topics go out on its
    /// connection (the simulator sees the certificate), an MDM push with the MDM certificate,
    /// and an MDM push whose topic's credential is a token is invalid (MDMNeedsCertificate).
    @Test func theRelaySendsWithCertificatesAndMDMPushesNeedOne() async throws {
        let authority = try CertificateAuthority(), files = try Files()
        let app = try files.pem(try authority.issue(uid: "com.example.cert", topics: ["com.example.cert", "com.example.cert.voip"],
                                                    development: false, production: true), "app")
        let mdm = try files.pem(try authority.issue(uid: Self.mdmTopic), "mdm")
        let harness = try await RelayHarness.start(configure: {
            $0.signingKeys = []
            $0.clientCertificateTrustRoots = [authority.certificate]
            $0.environment = .production
        }, configureRelay: {
            $0.apns.credentials[0].topics.append(Self.tokenMDMTopic)
            $0.apns.credentials += [.init(certificateFile: app.cert, keyFile: app.key),
                                    .init(certificateFile: mdm.cert, keyFile: mdm.key)]
        })
        let magic = #"{"mdm":"5f1e2d3c-0000-4000-8000-1234567890ab"}"#
        let intents = [
            #"{"id":"cert-alert","token":"\#(hexToken(1))","topic":"com.example.cert","payload":{"aps":{"alert":"hi"}}}"#,
            #"{"id":"cert-voip","token":"\#(hexToken(2))","topic":"com.example.cert.voip","push_type":"voip","payload":{"aps":{}}}"#,
            #"{"id":"mdm","token":"\#(hexToken(3))","topic":"\#(Self.mdmTopic)","push_type":"mdm","payload":\#(magic)}"#,
            #"{"id":"mdm-token","token":"\#(hexToken(4))","topic":"\#(Self.tokenMDMTopic)","push_type":"mdm","payload":\#(magic)}"#,
            #"{"id":"mdm-aps","token":"\#(hexToken(5))","topic":"\#(Self.mdmTopic)","push_type":"mdm","payload":{"aps":{},"mdm":"x"}}"#,
            #"{"id":"cert-sandbox","token":"\#(hexToken(6))","topic":"com.example.cert","environment":"development","payload":{"aps":{}}}"#,
            #"{"id":"cert-other","token":"\#(hexToken(7))","topic":"com.example.cert.location-query","push_type":"location","payload":{"aps":{}}}"#,
        ]
        for (index, json) in intents.enumerated() { try await harness.produce(json, key: hexToken(index + 1)) }
        let outcomes = try await harness.outcomes(count: intents.count)
        await harness.stop()
        var byID: [String: [String: Any]] = [:]
        for outcome in outcomes { byID[outcome["id"] as? String ?? ""] = outcome }
        for id in ["cert-alert", "cert-voip", "mdm"] {
            #expect(byID[id]?["status"] as? String == "delivered", "\(byID[id] ?? [:])")
        }
        #expect(byID["mdm-token"]?["status"] as? String == "invalid" && (byID["mdm-token"]?["reason"] as? String)?.hasPrefix("MDMNeedsCertificate: ") == true,
                "\(byID["mdm-token"] ?? [:])")
        #expect(byID["mdm-aps"]?["status"] as? String == "invalid" && (byID["mdm-aps"]?["reason"] as? String)?.hasPrefix("BadPayload: ") == true,
                "\(byID["mdm-aps"] ?? [:])")
        // Refused before a request: the certificate is for production only, and names no
        // location topic (the relay has no credential for it).
        #expect(byID["cert-sandbox"]?["status"] as? String == "failed"
                && (byID["cert-sandbox"]?["reason"] as? String)?.hasPrefix("BadCertificateEnvironment: ") == true, "\(byID["cert-sandbox"] ?? [:])")
        #expect(byID["cert-other"]?["status"] as? String == "failed" && byID["cert-other"]?["reason"] as? String == "NoCredentials",
                "\(byID["cert-other"] ?? [:])")
        let accepted = harness.simulator.accepted
        #expect(accepted.count == 3)
        #expect(Set(accepted.map { "\($0.topic) \($0.clientCertificate ?? "-")" }) == [
            "com.example.cert com.example.cert", "com.example.cert.voip com.example.cert", "\(Self.mdmTopic) \(Self.mdmTopic)",
        ])
        #expect(accepted.first { $0.pushType == "mdm" }.map { String(decoding: $0.payload, as: UTF8.self) } == magic)
    }
}


/// A certificate renewed behind a mounted Secret, and `check-config`'s word on expiry, through
/// the `apns-relay` binary.
@Suite("Certificate renewal and expiry, through the binary", .stopsItsRelays, .timeLimit(.minutes(3)))
struct CertificateProcessTests {
    /// The Secret's files swap for a renewed certificate that also names the app's voip topic:
    /// the intent at APNs while the change is seen finishes on the old connection (answered
    /// once, delivered), and the relay goes on with the new certificate, whose expiry it exports.
    @Test func aRenewedCertificateIsPickedUpWithoutDroppingWorkInFlight() async throws {
        let authority = try CertificateAuthority()
        let harness = try await ProcessHarness.start(latency: .seconds(2)) {
            $0.signingKeys = []
            $0.clientCertificateTrustRoots = [authority.certificate]
        }
        let renewedExpiry = Date().addingTimeInterval(400 * 86_400)
        let old = try authority.issue(uid: "com.example.app", notValidAfter: Date().addingTimeInterval(20 * 86_400))
        let renewed = try authority.issue(uid: "com.example.app", topics: ["com.example.app", "com.example.app.voip"],
                                          notValidAfter: renewedExpiry)
        var secret = try KubeletVolume(["tls.crt": old.certificatePEM, "tls.key": old.privateKeyPEM])
        let port = try await freePort()
        let config = try writeConfig(harness: harness, httpPort: port,
                                     credentials: ["{cert_file: \(secret.path("tls.crt")), key_file: \(secret.path("tls.key"))}"])
        let relay = try RelayProcess.start(config: config, extraArguments: ["--reload-check-ms", "300"])
        try await CredentialReloadTests.waitForMetric("apns_relay_intents_consumed_total", port: port)
        func send(_ id: String, topic: String, pushType: String, token: Int) async throws {
            let value = #"{"id":"\#(id)","token":"\#(hexToken(token))","topic":"\#(topic)","push_type":"\#(pushType)","payload":{"aps":{}}}"#
            _ = try await harness.producer.send(topic: harness.intentsTopic, key: Array(hexToken(token).utf8), value: Array(value.utf8))
        }
        // The old certificate does not name the voip topic: no credential covers it.
        try await send("voip-before", topic: "com.example.app.voip", pushType: "voip", token: 1)
        _ = try await harness.outcomes(distinct: 1)
        try await send("in-flight", topic: "com.example.app", pushType: "alert", token: 2)
        try await CredentialReloadTests.waitForMetric(#"apns_relay_intents_consumed_total{lane="\#(harness.intentsTopic)"} 2"#, port: port)
        try secret.update(["tls.crt": renewed.certificatePEM, "tls.key": renewed.privateKeyPEM])
        try await CredentialReloadTests.waitForMetric(#"apns_relay_config_reloads_total{result="applied"} 1"#, port: port)
        // The renewed certificate's expiry is exported.
        var exported = "nothing"
        do {
            try await waitUntil(timeout: .seconds(60), asking: {
                let body = (try? await httpGet(port: port, path: "/metrics"))?.body ?? ""
                exported = body.split(separator: "\n").first { $0.hasPrefix("apns_relay_certificate_expiry_timestamp_seconds{") }.map(String.init) ?? "no line"
                // The certificate keeps whole seconds: within one of the Date it was made with.
                return Double(exported.split(separator: " ").last ?? "").map { abs($0 - renewedExpiry.timeIntervalSince1970) <= 1 } == true
            })
        } catch {
            _ = await relay.terminate()
            await harness.simulator.stop()
            Issue.record("the renewed certificate's expiry \(renewedExpiry.timeIntervalSince1970.rounded(.down)) is not exported; last seen: \(exported)\n\(relay.printed.suffix(4000))")
            throw error
        }
        try await send("voip-after", topic: "com.example.app.voip", pushType: "voip", token: 3)

        let outcomes = try await harness.outcomes(distinct: 3)
        var status: [String: [String]] = [:]
        for text in outcomes {
            guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                  let id = object["id"] as? String else { continue }
            status[id, default: []].append("\(object["status"] ?? "") \(object["reason"] as? String ?? "")")
        }
        #expect(status["voip-before"] == ["failed NoCredentials"], "\(status)")
        #expect(status["in-flight"] == ["delivered "], "finished by the drain, answered once: \(status)")
        #expect(status["voip-after"] == ["delivered "], "\(status)")
        #expect(harness.simulator.accepted.filter { $0.deviceToken == hexToken(2) }.count == 1, "sent once")
        #expect(await relay.terminate() == 0)
        await harness.simulator.stop()
    }

    /// `check-config` warns (exit 0) about a certificate that expires within 30 days and fails
    /// (exit 2) on an expired one.
    @Test func checkConfigWarnsBeforeExpiryAndFailsAfter() async throws {
        let authority = try CertificateAuthority()
        let files = try CertificateCredentialTests.Files()
        func check(_ expiry: TimeInterval) async throws -> (status: Int32, stderr: String) {
            let identity = try authority.issue(uid: "com.example.app", notValidBefore: Date().addingTimeInterval(-400 * 86_400),
                                               notValidAfter: Date().addingTimeInterval(expiry))
            let cert = try files.pem(identity, "expiry-\(Int(expiry))")
            let config = files.directory.appendingPathComponent("config-\(Int(expiry)).yaml").path
            try "apns:\n  credentials:\n    - {cert_file: \(cert.cert), key_file: \(cert.key)}\n".write(toFile: config, atomically: true, encoding: .utf8)
            let result = try await RelayBinary.run(["check-config", config])
            return (result.status, result.stderr)
        }
        let soon = try await check(12 * 86_400 + 3600)
        #expect(soon.status == 0 && soon.stderr.contains("warning: apns.credentials[0].cert_file") && soon.stderr.contains("in 12 days"), "\(soon.stderr)")
        let later = try await check(90 * 86_400)
        #expect(later.status == 0 && later.stderr.isEmpty, "\(later.stderr)")
        let expired = try await check(-3600)
        #expect(expired.status == 2 && expired.stderr.contains("expired at"), "\(expired.stderr)")
    }
}
