import APNs
import APNsSimulator
import Foundation
import NIOCore
import TestSupport
import Testing

/// `apns.proxy`: connections tunnel through a real HTTP proxy (tinyproxy) with `CONNECT`, TLS
/// and HTTP/2 end to end inside; a proxy that refuses is a clear connection error.
@Suite("APNs through an HTTP proxy", .timeLimit(.minutes(2)))
struct ProxyTests {
    static let notification = APNsNotification(deviceToken: sampleToken, topic: sampleTopic, pushType: .alert, priority: 10,
                                               expiration: 0, collapseID: nil, payload: ByteBuffer(string: #"{"aps":{"alert":"hi"}}"#))

    static func harness(_ proxy: String, noProxy: [String] = [], requestTimeout: TimeAmount = .seconds(10)) async throws -> Harness {
        let parsed = try APNsProxy(parsing: proxy, noProxy: noProxy)
        return try await Harness.start(requestTimeout: requestTimeout, configureClient: { $0.proxy = parsed })
    }

    @Test func notificationsGoThroughTheTunnel() async throws {
        let proxy = try await TinyproxyProcess.started()
        let harness = try await Self.harness(proxy.url)
        let result = try await harness.client.send(Self.notification)
        #expect(result.classification == .delivered)
        #expect(harness.simulator.accepted.count == 1)
        #expect(proxy.log.contains("CONNECT 127.0.0.1:\(harness.simulator.port) HTTP/1.1"), "the proxy carried the connection:\n\(proxy.log)")
        await harness.stop()
    }

    @Test func basicAuthIsSentAndAWrongPasswordIsAClearError() async throws {
        let proxy = try await TinyproxyProcess.started(basicAuth: ("relay", "s3cret"))
        let good = try await Self.harness("http://relay:s3cret@127.0.0.1:\(proxy.port)")
        #expect(try await good.client.send(Self.notification).classification == .delivered)
        await good.stop()

        // tinyproxy answers a wrong password 401, none at all 407.
        for (url, answer) in [("http://relay:wrong@127.0.0.1:\(proxy.port)", "answered CONNECT with 401"),
                              ("http://127.0.0.1:\(proxy.port)", "407 Proxy Authentication Required")] {
            let bad = try await Self.harness(url, requestTimeout: .seconds(2))
            let result = try await bad.client.send(Self.notification)
            let failure = try #require(result.failure?.description)
            #expect(failure.contains(answer), "\(failure)")
            #expect(failure.contains("127.0.0.1:\(proxy.port)") && !failure.contains("wrong"), "\(failure)")
            #expect(bad.simulator.accepted.isEmpty)
            await bad.stop()
        }
    }

    @Test func aProxyThatRefusesTheTunnelIsAClearError() async throws {
        // It tunnels to port 1 only: CONNECT to the simulator is refused (403).
        let proxy = try await TinyproxyProcess.started(connectPorts: [1])
        let harness = try await Self.harness(proxy.url, requestTimeout: .seconds(2))
        let result = try await harness.client.send(Self.notification)
        let failure = try #require(result.failure?.description)
        #expect(failure.contains("answered CONNECT with 403"), "\(failure)")
        #expect(harness.simulator.accepted.isEmpty)
        await harness.stop()
    }

    /// A host `no_proxy` names is reached directly: here the proxy does not even exist.
    @Test func noProxyHostsAreReachedDirectly() async throws {
        let harness = try await Self.harness("http://127.0.0.1:1", noProxy: ["localhost", "127.0.0.1"])
        #expect(try await harness.client.send(Self.notification).classification == .delivered)
        await harness.stop()
    }

    /// A proxy nobody listens on: the error names it (not the APNs host behind it).
    @Test func anUnreachableProxyIsNamed() async throws {
        let harness = try await Self.harness("http://u:secret@127.0.0.1:1", requestTimeout: .seconds(1))
        let failure = try #require(try await harness.client.send(Self.notification).failure?.description)
        #expect(failure.contains("proxy http://u:<redacted>@127.0.0.1:1: cannot connect to 127.0.0.1:1"), "\(failure)")
        await harness.stop()
    }

    /// `send --proxy` (or `APNS_RELAY_APNS_PROXY`) tunnels the one push too, and `channels
    /// --proxy` its management request.
    @Test func sendTakesAProxy() async throws {
        let proxy = try await TinyproxyProcess.started(basicAuth: ("relay", "s3cret"))
        let key = TestKey()
        var configuration = SimulatorConfiguration()
        configuration.signingKeys = [key.simulatorKey]
        let simulator = try await APNsSimulator.start(configuration)
        let send = ["send", "--endpoint", simulator.url, "--insecure", "--team-id", TestKey.teamID, "--key-id", TestKey.keyID,
                    "--key-file", try key.writeP8(), "--topic", sampleTopic, "--token", sampleToken, "--alert", "hi", "--timeout", "5"]
        let viaFlag = try await RelayBinary.run(send + ["--proxy", "http://relay:s3cret@127.0.0.1:\(proxy.port)"])
        #expect(viaFlag.status == 0, "\(viaFlag.stdout) \(viaFlag.stderr)")
        let viaEnvironment = try await RelayBinary.run(send, environment: ["APNS_RELAY_APNS_PROXY": "http://relay:wrong@127.0.0.1:\(proxy.port)"])
        #expect(viaEnvironment.status == 1 && viaEnvironment.stdout.contains("401"), "\(viaEnvironment.stdout)")
        #expect(!viaEnvironment.stdout.contains("wrong") && !viaEnvironment.stderr.contains("wrong"))
        #expect(simulator.accepted.count == 1)
        // So does channel management.
        let channels = ["channels", "create", "--storage-policy", "0", "--bundle-id", "com.example.live", "--environment", simulator.url,
                        "--insecure", "--team-id", TestKey.teamID, "--key-id", TestKey.keyID, "--key-file", try key.writeP8(),
                        "--proxy", "http://relay:s3cret@127.0.0.1:\(proxy.port)"]
        let created = try await RelayBinary.run(channels)
        #expect(created.status == 0 && simulator.channels(of: "com.example.live").count == 1, "\(created.stdout) \(created.stderr)")
        #expect(proxy.log.contains("CONNECT 127.0.0.1:\(simulator.port)"))
        await simulator.stop()
    }

    @Test func proxyURLsAreParsedAndTheirPasswordNeverShown() throws {
        let full = try APNsProxy(parsing: "http://us%40er:p%3Ass@proxy.corp:3128/")
        #expect(full.host == "proxy.corp" && full.port == 3128 && full.username == "us@er" && full.password == "p:ss")
        #expect(full.description == "http://us@er:<redacted>@proxy.corp:3128")
        let plain = try APNsProxy(parsing: "http://[::1]")
        #expect(plain.host == "::1" && plain.port == 80 && plain.username == nil && plain.description == "http://[::1]:80")
        for bad in ["https://proxy:3128", "proxy:3128", "http://", "http://:3128", "http://proxy:0", "http://proxy:x",
                    "http://u:secret@proxy:99999"] {
            #expect(throws: APNsError.self, "\(bad)") { try APNsProxy(parsing: bad) }
        }
        // However the text is wrong, no part of a password shows in the error.
        for bad in ["http://u:secret@proxy:99999", "u:secret@proxy:3128", "http://u:sec@ret@proxy:x", "http://a/b:secret@proxy:x",
                    "http://u%3Av:secret@proxy:3128"] {
            do {
                _ = try APNsProxy(parsing: bad)
                Issue.record("\(bad) was accepted")
            } catch {
                #expect(!"\(error)".contains("secret") && !"\(error)".contains("ret@"), "\(error)")
            }
        }
        #expect(APNsProxy.redacted("http://proxy:3128") == "http://proxy:3128")
        #expect(try APNsProxy(parsing: "http://u:p%25%40ss@proxy").password == "p%@ss")
        let scoped = try APNsProxy(parsing: "http://proxy:3128", noProxy: [".apple.com", " internal ", "*.corp", "127.0.0.1", "[::1]"])
        #expect(!scoped.isUsed(for: "api.push.apple.com") && !scoped.isUsed(for: "apple.com") && !scoped.isUsed(for: "INTERNAL"))
        #expect(!scoped.isUsed(for: "push.corp") && !scoped.isUsed(for: "127.0.0.1") && !scoped.isUsed(for: "::1"))
        #expect(scoped.isUsed(for: "notapple.com") && scoped.isUsed(for: "internal.example") && scoped.isUsed(for: "10.127.0.0.1"))
        #expect(!(try APNsProxy(parsing: "http://proxy:3128", noProxy: ["*"])).isUsed(for: "anything"))
        #expect(APNsProxy.noProxyProblem("10.0.0.0/8") != nil && APNsProxy.noProxyProblem("host:443") != nil)
        #expect(APNsProxy.noProxyProblem("a*.b") != nil && APNsProxy.noProxyProblem("") != nil)
        for fine in ["*", "*.apple.com", ".apple.com", "::1", "[::1]", "10.0.0.1"] { #expect(APNsProxy.noProxyProblem(fine) == nil, "\(fine)") }
    }
}
