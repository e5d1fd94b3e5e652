public import APNs
import Foundation
import NIOSSL

extension RelayConfiguration {
    /// Every credential's signing key, read from its `key_file` now, in `apns.credentials` order.
    public func loadSigners() throws -> [ProviderTokenSigner] {
        try apns.credentials.map { try ProviderTokenSigner(teamID: $0.teamID, keyID: $0.keyID, keyFile: $0.keyFile) }
    }

    /// What keeps a configuration that loaded from working as meant, found by reading every file
    /// it names, before anything connects: no credential at all (every intent would come out
    /// `failed`, `NoCredentials`), a `.p8` key that is not a P-256 key, a topic in `policy.topics` or one claimed
    /// by two credentials, and Kafka TLS files (`ssl.ca.location`, `ssl.certificate.location`,
    /// `ssl.key.location`, with `ssl.key.password`) that do not parse; `ssl.keystore.location`
    /// and `sasl.kerberos.keytab` must be readable. `check-config` fails on any of these, `run`
    /// does not start, and a reload that has one is refused.
    public var preflightProblems: [String] { preflight().problems }

    /// ``preflightProblems``, and the credentials' signing keys as that check read them (one per
    /// credential when every key parsed): a caller that goes on uses these, not another read.
    public func preflight() -> (problems: [String], signers: [ProviderTokenSigner]) {
        var problems: [String] = []
        var signers: [ProviderTokenSigner] = []
        if apns.credentials.isEmpty {
            problems.append("apns.credentials is empty: every intent would come out failed (NoCredentials); list at least one {team_id, key_id, key_file, topics}")
        }
        var claimedBy: [String: Int] = [:]
        for (index, credential) in apns.credentials.enumerated() {
            do {
                signers.append(try ProviderTokenSigner(teamID: credential.teamID, keyID: credential.keyID, keyFile: credential.keyFile))
            } catch {
                problems.append("apns.credentials[\(index)].key_file \(credential.keyFile): \(error)")
            }
            for topic in credential.topics {
                if let first = claimedBy[topic] {
                    problems.append("apns.credentials[\(index)].topics: \(topic) is claimed by apns.credentials[\(first)] too")
                } else {
                    claimedBy[topic] = index
                }
            }
        }
        let directory = CredentialDirectory(apns.credentials)
        for topic in policy.topics.keys.sorted() where directory.index(forTopic: topic) == nil {
            problems.append("policy.topics.\(topic): no credential in apns.credentials covers this topic")
        }
        problems += Self.kafkaFileProblems(kafka.properties)
        return (problems, signers)
    }

    /// The Kafka client's TLS files (when `security.protocol` is `SSL` or `SASL_SSL`: librdkafka
    /// ignores them otherwise) and Kerberos keytab, read as librdkafka would read them.
    static func kafkaFileProblems(_ properties: [String: String]) -> [String] {
        var problems: [String] = []
        let protocolName = (properties["security.protocol"] ?? "plaintext").lowercased()
        let tls = protocolName == "ssl" || protocolName == "sasl_ssl"
        func problem(_ key: String, _ path: String, _ what: String) {
            problems.append("kafka.config.\(key) \(path): \(what)")
        }
        if tls, let path = properties["ssl.ca.location"], !path.isEmpty, path != "probe" {
            var directory: ObjCBool = false
            if FileManager.default.fileExists(atPath: path, isDirectory: &directory), directory.boolValue {
                if !FileManager.default.isReadableFile(atPath: path) { problem("ssl.ca.location", path, "the directory is not readable") }
            } else {
                problems += certificateProblems("ssl.ca.location", path)
            }
        }
        if tls, let path = properties["ssl.certificate.location"], !path.isEmpty {
            problems += certificateProblems("ssl.certificate.location", path)
        }
        if tls, let path = properties["ssl.key.location"], !path.isEmpty {
            let password = properties["ssl.key.password"]
            do {
                if let password {
                    _ = try NIOSSLPrivateKey(file: path, format: .pem) { (set: ([UInt8]) -> Void) in set(Array(password.utf8)) }
                } else {
                    _ = try NIOSSLPrivateKey(file: path, format: .pem)
                }
            } catch {
                problem("ssl.key.location", path, "not a PEM private key\(password == nil ? "" : " that ssl.key.password opens") (\(error))")
            }
        }
        for key in ["ssl.keystore.location", "sasl.kerberos.keytab"] where key.hasPrefix("sasl") || tls {
            if let path = properties[key], !path.isEmpty, !FileManager.default.isReadableFile(atPath: path) {
                problem(key, path, "not a readable file")
            }
        }
        return problems
    }

    private static func certificateProblems(_ key: String, _ path: String) -> [String] {
        guard FileManager.default.isReadableFile(atPath: path) else {
            return ["kafka.config.\(key) \(path): not a readable file"]
        }
        do {
            if try NIOSSLCertificate.fromPEMFile(path).isEmpty {
                return ["kafka.config.\(key) \(path): holds no PEM certificate"]
            }
        } catch {
            return ["kafka.config.\(key) \(path): not PEM certificates (\(error))"]
        }
        return []
    }
}
