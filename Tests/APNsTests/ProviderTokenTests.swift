import APNs
import Crypto
import Foundation
import Testing
import TestSupport

@Suite("Provider tokens", .timeLimit(.minutes(3)))
struct ProviderTokenTests {
    @Test func tokenVerifiesWithThePublicKey() throws {
        let key = TestKey()
        let jwt = try key.signer.mint(issuedAt: 1_700_000_000)
        let parts = jwt.split(separator: ".")
        #expect(parts.count == 3)
        let header = try #require(Base64URL.decode(parts[0]))
        let claims = try #require(Base64URL.decode(parts[1]))
        #expect(String(decoding: header, as: UTF8.self) == #"{"alg":"ES256","kid":"ABC123DEFG"}"#)
        #expect(String(decoding: claims, as: UTF8.self) == #"{"iss":"TEAM123456","iat":1700000000}"#)
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: try #require(Base64URL.decode(parts[2])))
        #expect(signature.rawRepresentation.count == 64)
        let signed = Array("\(parts[0]).\(parts[1])".utf8)
        #expect(key.privateKey.publicKey.isValidSignature(signature, for: signed))
        #expect(!P256.Signing.PrivateKey().publicKey.isValidSignature(signature, for: signed))
    }

    @Test func mintsOncePerRefreshAgeAndNeverWithinTwentyMinutes() throws {
        let clock = ManualClock(1_700_000_000)
        let source = try LocalProviderTokenSource(signer: TestKey().signer, clock: clock.function)
        let first = try source.currentToken()
        clock.advance(19 * 60)
        #expect(try source.currentToken() == first)
        // A rejection within 20 minutes of the mint does not mint again.
        #expect(try source.refresh(after: first) == first)
        #expect(source.mintCount == 1)
        clock.advance(30 * 60)  // 49 minutes old
        #expect(try source.currentToken() == first)
        clock.advance(60)  // 50 minutes: refresh age reached
        let second = try source.currentToken()
        #expect(second != first)
        #expect(source.mintCount == 2)
        // A rejection of a token that was already replaced returns the replacement.
        #expect(try source.refresh(after: first) == second)
        #expect(source.mintCount == 2)
    }

    @Test func refreshAfterExpiryMintsOnce() throws {
        let clock = ManualClock(1_700_000_000)
        let source = try LocalProviderTokenSource(signer: TestKey().signer, clock: clock.function)
        let first = try source.currentToken()
        clock.advance(25 * 60)
        let second = try source.refresh(after: first)
        #expect(second != first)
        #expect(try source.refresh(after: first) == second)
        #expect(source.mintCount == 2)
    }

    @Test func refreshAgeMustBeBetweenTwentyAndFiftyFiveMinutes() {
        #expect(throws: APNsError.self) { try LocalProviderTokenSource(signer: TestKey().signer, refreshAgeSeconds: 19 * 60) }
        #expect(throws: APNsError.self) { try LocalProviderTokenSource(signer: TestKey().signer, refreshAgeSeconds: 56 * 60) }
        #expect(throws: Never.self) { try LocalProviderTokenSource(signer: TestKey().signer, refreshAgeSeconds: 20 * 60) }
    }

    @Test func badKeyFilesFailWithTheCause() throws {
        #expect(throws: APNsError.self) { try ProviderTokenSigner(teamID: "T", keyID: "K", keyFile: "/nonexistent/AuthKey.p8") }
        let garbage = TestFiles.path("garbage-\(UUID()).p8").path
        try "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n".write(toFile: garbage, atomically: true, encoding: .utf8)
        do {
            _ = try ProviderTokenSigner(teamID: "T", keyID: "K", keyFile: garbage)
            Issue.record("a malformed key file was accepted")
        } catch {
            #expect(error.description.contains(garbage))
        }
        let good = try TestKey().writeP8()
        #expect(throws: Never.self) { try ProviderTokenSigner(teamID: "T", keyID: "K", keyFile: good) }
    }
}
