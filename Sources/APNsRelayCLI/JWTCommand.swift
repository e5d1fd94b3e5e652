import APNs
import ArgumentParser
import Foundation
import CommandLineSupport

/// `apns-relay jwt`: prints a provider token, for h2load and curl against a simulator.
struct JWTCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jwt", abstract: "Print a provider token (ES256 JWT) signed with a .p8 key.")

    @Option(name: .customLong("team-id"), help: "Apple team id (10 characters): the token's iss.")
    var teamID: String
    @Option(name: .customLong("key-id"), help: "Key id of the signing key (10 characters): the token's kid.")
    var keyID: String
    @Option(name: .customLong("key-file"), help: "The .p8 (PKCS#8 PEM) signing key.")
    var keyFile: String

    @OptionGroup var logging: LoggingOptions

    func run() throws {
        try logging.bootstrap(defaultLevel: .error)
        do {
            let signer = try ProviderTokenSigner(teamID: teamID, keyID: keyID, keyFile: keyFile)
            Terminal.line(try signer.mint(issuedAt: Int64(Date().timeIntervalSince1970)))
        } catch {
            Terminal.error("\(error)")
            throw ExitCode(1)
        }
    }
}
