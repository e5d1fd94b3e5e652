@testable import CommandLineSupport
import Testing

@Suite("--cert-passphrase and its variable", .timeLimit(.minutes(1)))
struct CredentialOptionsTests {
    @Test func theFlagWinsOverTheVariableWhichKeepsThePassphraseOffTheCommandLine() throws {
        let variable = CredentialOptions.passphraseVariable
        #expect(variable == "APNS_RELAY_CERT_PASSPHRASE")
        let fromVariable = try CredentialOptions.parse(["--cert-file", "cert.p12"])
        #expect(fromVariable.passphrase(environment: [variable: "s3cret"]) == "s3cret")
        #expect(fromVariable.passphrase(environment: [:]) == nil)
        let fromFlag = try CredentialOptions.parse(["--cert-file", "cert.p12", "--cert-passphrase", "given"])
        #expect(fromFlag.passphrase(environment: [variable: "s3cret"]) == "given")
    }
}
