public import APNs
public import Foundation
public import Logging
import NIOSSL

/// A credential as read from its files: what the relay's APNs clients connect with.
public enum LoadedCredential: Sendable {
    /// Token auth: the `.p8` signing key.
    case token(ProviderTokenSigner)
    /// Certificate auth: the client certificate, its key and what it says.
    case certificate(APNsCertificateIdentity)

    /// The topics it sends for: the configured ones, else (a certificate's) its own.
    func topics(configured: [String]) -> [String] {
        guard configured.isEmpty, case .certificate(let identity) = self else { return configured }
        return identity.info.topics
    }

    /// Whom a credential fault is counted for, and cooled down (`apns_relay_credential_faults_total{team_id}`):
    /// the team id, for a certificate its subject (its UID): one certificate's fault stops
    /// neither the team's keys nor its other certificates.
    var team: String {
        switch self {
        case .token(let signer): signer.teamID
        case .certificate(let identity): identity.info.subject
        }
    }

    var isCertificate: Bool { certificate != nil }

    /// How metrics name it (`apns_relay_apns_connections_ready{credential}`): `TEAM:KEY`, or a
    /// certificate's subject.
    var metricsName: String {
        switch self {
        case .token(let signer): "\(signer.teamID):\(signer.keyID)"
        case .certificate(let identity): identity.info.subject
        }
    }

    /// What the certificate says; nil for a token.
    var certificate: APNsCertificateInfo? {
        if case .certificate(let identity) = self { return identity.info }
        return nil
    }
}

/// What reading a configuration's files found: the problems that keep it from starting, the
/// certificates it runs without (expired or not valid yet), the warnings (a certificate that
/// expires within 30 days, a topic its certificate does not name), and the credentials read.
public struct PreflightResult: Sendable {
    public var problems: [String] = []
    /// Certificates that cannot be used now: `check-config` fails on them; `run` and reloads
    /// log them as errors and go on, their topics' intents answered `failed`
    /// (`CertificateExpired`, `CertificateNotYetValid`), so one customer's lapsed certificate
    /// does not stop every other topic.
    public var unusable: [String] = []
    public var warnings: [String] = []
    /// One per `apns.credentials` entry when every one could be read.
    public var credentials: [LoadedCredential] = []

    /// Logs what `run` and a reload go on with: unusable certificates as errors, warnings.
    public func log(_ logger: Logger) {
        for certificate in unusable {
            logger.error("a certificate cannot be used: its topics' intents come out failed", metadata: ["apns.credential": "\(certificate)"])
        }
        for warning in warnings { logger.warning("\(warning)") }
    }
}

extension RelayConfiguration {
    /// A certificate that expires within this long is warned about.
    public static let certificateWarningSeconds: TimeInterval = 30 * 86_400

    /// Every credential read from its files now, in `apns.credentials` order (a PKCS#12 or key
    /// passphrase from the environment variable `passphrase_env` names).
    public func loadCredentials(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> [LoadedCredential] {
        try apns.credentials.map { try Self.load($0, environment: environment) }
    }

    static func load(_ credential: Credential, environment: [String: String]) throws -> LoadedCredential {
        switch credential.kind {
        case .token(let teamID, let keyID, let keyFile):
            return .token(try ProviderTokenSigner(teamID: teamID, keyID: keyID, keyFile: keyFile))
        case .certificate(let certificateFile, let keyFile, let passphraseEnvironment):
            var passphrase: String?
            if let passphraseEnvironment {
                guard let value = environment[passphraseEnvironment] else {
                    throw APNsError.credential("passphrase_env names \(passphraseEnvironment), which is not set")
                }
                passphrase = value
            }
            return .certificate(try APNsCertificateIdentity(certificateFile: certificateFile, keyFile: keyFile, passphrase: passphrase))
        }
    }

    /// Each credential's topics: the configured ones, or a certificate's own (``LoadedCredential``).
    static func effectiveTopics(_ credentials: [Credential], _ loaded: [LoadedCredential]) -> [[String]] {
        zip(credentials, loaded).map { $1.topics(configured: $0.topics) }
    }

    /// What keeps a configuration that loaded from working as meant, found by reading every file
    /// it names, before anything connects: no credential at all (every intent would come out
    /// `failed`, `NoCredentials`), a `.p8` key that is not a P-256 key, a certificate or its key
    /// that does not read (or its passphrase variable unset), a certificate expired or not valid
    /// yet, or one with no topic of its own when the file lists none, a topic in `policy.topics`
    /// or one claimed by two credentials, and Kafka TLS files (`ssl.ca.location`,
    /// `ssl.certificate.location`, `ssl.key.location`, with `ssl.key.password`) that do not
    /// parse; `ssl.keystore.location` and `sasl.kerberos.keytab` must be readable. `check-config`
    /// fails on any of these, `run` does not start, and a reload that has one is refused.
    public var preflightProblems: [String] { preflight().problems }

    /// ``preflightProblems``, the warnings (a certificate that expires within 30 days), and the
    /// credentials as that check read them (one per entry when every one was read): a caller
    /// that goes on uses these, not another read.
    public func preflight(now: Date = Date(), environment: [String: String] = ProcessInfo.processInfo.environment) -> PreflightResult {
        var result = PreflightResult()
        if apns.credentials.isEmpty {
            result.problems.append("apns.credentials is empty: every intent would come out failed (NoCredentials); list at least one {team_id, key_id, key_file, topics} or {cert_file, ...}")
        }
        var claimedBy: [String: Int] = [:]
        var loaded: [LoadedCredential] = []
        // Each credential's topics (a credential that did not read: the configured ones).
        var topics: [[String]] = []
        var exact: [Bool] = []
        for (index, credential) in apns.credentials.enumerated() {
            let key = "apns.credentials[\(index)]"
            let credentialFile: String
            switch credential.kind {
            case .token(_, _, let keyFile): credentialFile = "key_file \(keyFile)"
            case .certificate(let certificateFile, _, _): credentialFile = "cert_file \(certificateFile)"
            }
            do {
                loaded.append(try Self.load(credential, environment: environment))
            } catch {
                result.problems.append("\(key).\(credentialFile): \(error)")
                topics.append(credential.topics)
                exact.append(credential.isCertificate)
                continue
            }
            if case .certificate(let identity) = loaded.last! {
                let info = identity.info
                if info.notValidAfter <= now {
                    result.unusable.append("\(key).\(credentialFile): the certificate of \(info.subject) expired at \(Self.timestamp(info.notValidAfter))")
                } else if info.notValidBefore > now {
                    result.unusable.append("\(key).\(credentialFile): the certificate of \(info.subject) is not valid before \(Self.timestamp(info.notValidBefore))")
                } else if info.notValidAfter.timeIntervalSince(now) < Self.certificateWarningSeconds {
                    let days = Int(info.notValidAfter.timeIntervalSince(now) / 86_400)
                    result.warnings.append("\(key).\(credentialFile): the certificate of \(info.subject) expires at \(Self.timestamp(info.notValidAfter)), in \(days) days: renew it")
                }
                if credential.topics.isEmpty, info.topics.isEmpty {
                    result.problems.append("\(key).topics: the certificate names no topic (no subject UID, no topics extension): list its topics")
                }
                for topic in credential.topics where !info.topics.isEmpty && !info.topics.contains(topic) {
                    result.warnings.append("\(key).topics: \(topic) is not one of the certificate's topics \(info.topics): APNs refuses it (TopicDisallowed)")
                }
            }
            topics.append(loaded.last!.topics(configured: credential.topics))
            exact.append(credential.isCertificate)
            for topic in topics.last! {
                if let first = claimedBy[topic] {
                    result.problems.append("\(key).topics: \(topic) is claimed by apns.credentials[\(first)] too")
                } else {
                    claimedBy[topic] = index
                }
            }
        }
        if loaded.count == apns.credentials.count { result.credentials = loaded }
        let directory = CredentialDirectory(topics: topics, exact: exact)
        for topic in policy.topics.keys.sorted() where directory.index(forTopic: topic) == nil {
            result.problems.append("policy.topics.\(topic): no credential in apns.credentials covers this topic")
        }
        result.problems += Self.redisTLSProblems(redis)
        // The files each client is given (the shared map's problems named once).
        for problem in Self.kafkaFileProblems(kafka.consumerSettings) + Self.kafkaFileProblems(kafka.producerSettings)
        where !result.problems.contains(problem) {
            result.problems.append(problem)
        }
        return result
    }

    private static func timestamp(_ date: Date) -> String {
        ISO8601DateFormatter().string(from: date)
    }

    /// The Kafka client's TLS files (when `security.protocol` is `SSL` or `SASL_SSL`: librdkafka
    /// ignores them otherwise) and Kerberos keytab, read as librdkafka would read them.
    /// The Redis TLS files as the client reads them: the CA bundle and the client certificate
    /// parse, and the key with them.
    static func redisTLSProblems(_ redis: RedisSettings) -> [String] {
        var problems: [String] = []
        if !redis.tlsCAFile.isEmpty {
            do {
                if try NIOSSLCertificate.fromPEMFile(redis.tlsCAFile).isEmpty { problems.append("redis.tls_ca_file \(redis.tlsCAFile): no certificate in it") }
            } catch {
                problems.append("redis.tls_ca_file \(redis.tlsCAFile): \(error)")
            }
        }
        if !redis.tlsCertFile.isEmpty, !redis.tlsKeyFile.isEmpty {
            do {
                if try NIOSSLCertificate.fromPEMFile(redis.tlsCertFile).isEmpty { problems.append("redis.tls_cert_file \(redis.tlsCertFile): no certificate in it") }
            } catch {
                problems.append("redis.tls_cert_file \(redis.tlsCertFile): \(error)")
            }
            do {
                _ = try NIOSSLPrivateKey(file: redis.tlsKeyFile, format: .pem)
            } catch {
                problems.append("redis.tls_key_file \(redis.tlsKeyFile): \(error)")
            }
        }
        return problems
    }

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
