public import APNs
import Foundation
public import ArgumentParser

/// How `send` and `bench` authenticate: token (team, key, .p8) or certificate.
public struct CredentialOptions: ParsableArguments {
    public init() {}

    @Option(name: .customLong("team-id"), help: "Apple team id (token auth).")
    public var teamID: String?

    @Option(name: .customLong("key-id"), help: "Key id of the .p8 signing key (token auth).")
    public var keyID: String?

    @Option(name: .customLong("key-file"), help: "The .p8 (PKCS#8 PEM) signing key (token auth).")
    public var keyFile: String?

    @Option(name: .customLong("cert-file"), help: "Client certificate: PEM, or PKCS#12 (.p12) when --cert-key is absent.")
    public var certFile: String?

    @Option(name: .customLong("cert-key"), help: "PEM private key for --cert-file.")
    public var certKey: String?

    @Option(name: .customLong("cert-passphrase"),
            help: "Passphrase of a PKCS#12 --cert-file (or the environment variable \(Self.passphraseVariable), which keeps it out of the process list and the shell's history).")
    public var certPassphrase: String?

    /// Where the passphrase comes from when `--cert-passphrase` is not given.
    public static let passphraseVariable = "APNS_RELAY_CERT_PASSPHRASE"

    /// `--cert-passphrase`, else ``passphraseVariable`` from `environment`.
    public func passphrase(environment: [String: String]) -> String? {
        certPassphrase ?? environment[Self.passphraseVariable]
    }

    public func validate() throws {
        let token = teamID != nil || keyID != nil || keyFile != nil
        if token, certFile != nil {
            throw ValidationError("use either --team-id/--key-id/--key-file or --cert-file/--cert-key, not both")
        }
        if token, teamID == nil || keyID == nil || keyFile == nil {
            throw ValidationError("token auth needs all of --team-id, --key-id and --key-file")
        }
        if certKey != nil, certFile == nil {
            throw ValidationError("--cert-key needs --cert-file")
        }
    }

    public var isGiven: Bool { keyFile != nil || certFile != nil }

    public func credential() throws(APNsError) -> APNsCredential {
        if let teamID, let keyID, let keyFile {
            return try .token(teamID: teamID, keyID: keyID, keyFile: keyFile)
        }
        if let certFile {
            return try .certificate(certificateFile: certFile, keyFile: certKey,
                                    passphrase: passphrase(environment: ProcessInfo.processInfo.environment))
        }
        throw .credential("no credentials: give --team-id, --key-id and --key-file, or --cert-file")
    }
}

/// `--push-type` takes the names APNs knows; `--help` lists them.
extension PushType: ExpressibleByArgument {}
