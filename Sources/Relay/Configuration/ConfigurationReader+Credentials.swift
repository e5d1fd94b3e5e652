import Foundation

extension ConfigurationReader {
    /// One `apns.credentials` entry: a token credential `{team_id, key_id, key_file, topics}`
    /// or, with `cert_file`, a certificate credential.
    mutating func readCredential(_ item: Any, key: String) -> RelayConfiguration.Credential? {
        guard let fields = mapping(item, key: key) else { return nil }
        if fields["cert_file"] != nil { return readCertificateCredential(fields, key: key) }
        checkKnown(fields, prefix: key + ".", known: ["team_id", "key_id", "key_file", "topics"])
        let teamID = string(fields, key + ".team_id", default: "", nonEmpty: true, overridable: false)
        let keyID = string(fields, key + ".key_id", default: "", nonEmpty: true, overridable: false)
        let keyFile = string(fields, key + ".key_file", default: "", nonEmpty: true, overridable: false)
        for (name, value) in [("team_id", teamID), ("key_id", keyID)] where !value.isEmpty && value.count != 10 {
            issues.append(.init(key: "\(key).\(name)", value: value, allowed: "Apple's ids are 10 characters"))
        }
        let topics = credentialTopics(fields, key: key, required: true)
        if !keyFile.isEmpty, !FileManager.default.isReadableFile(atPath: keyFile) {
            issues.append(.init(key: "\(key).key_file", value: keyFile, allowed: "it must be a readable .p8 file"))
        }
        return RelayConfiguration.Credential(teamID: teamID, keyID: keyID, keyFile: keyFile, topics: topics)
    }

    /// `{cert_file, key_file}` (PEM) or `{cert_file}` (PKCS#12), with `passphrase_env` and
    /// optional `topics` (the certificate's own when left out).
    private mutating func readCertificateCredential(_ fields: [String: Any], key: String) -> RelayConfiguration.Credential {
        checkKnown(fields, prefix: key + ".", known: ["cert_file", "key_file", "passphrase_env", "topics"])
        let certificateFile = string(fields, key + ".cert_file", default: "", nonEmpty: true, overridable: false)
        let keyFile = fields["key_file"] == nil ? nil : string(fields, key + ".key_file", default: "", nonEmpty: true, overridable: false)
        let passphraseEnvironment = fields["passphrase_env"] == nil ? nil
            : string(fields, key + ".passphrase_env", default: "", nonEmpty: true, overridable: false)
        if let passphraseEnvironment, !passphraseEnvironment.isEmpty, !Self.isEnvironmentVariableName(passphraseEnvironment) {
            // Not shown: it may be the passphrase itself.
            issues.append(.init(key: "\(key).passphrase_env", value: "<redacted>",
                                allowed: "the name of an environment variable (letters, digits, _), never the passphrase itself"))
        }
        for (name, path) in [("cert_file", certificateFile), ("key_file", keyFile ?? "")]
        where !path.isEmpty && !FileManager.default.isReadableFile(atPath: path) {
            issues.append(.init(key: "\(key).\(name)", value: path, allowed: "it must be a readable file"))
        }
        let topics = credentialTopics(fields, key: key, required: false)
        return RelayConfiguration.Credential(certificateFile: certificateFile, keyFile: keyFile,
                                             passphraseEnvironment: passphraseEnvironment, topics: topics)
    }

    private mutating func credentialTopics(_ fields: [String: Any], key: String, required: Bool) -> [String] {
        var topics: [String] = []
        if let list = fields["topics"] as? [Any], !list.isEmpty {
            for topic in list {
                if let text = topic as? String, !text.isEmpty { topics.append(text) } else {
                    issues.append(.init(key: "\(key).topics", value: describe(topic), allowed: "topics are non-empty bundle ids"))
                }
            }
        } else if required || fields["topics"] != nil {
            issues.append(.init(key: "\(key).topics", value: describe(fields["topics"]),
                                allowed: required ? "list at least one bundle id" : "list at least one bundle id, or leave topics out to use the certificate's"))
        }
        return topics
    }

    private static func isEnvironmentVariableName(_ name: String) -> Bool {
        guard let first = name.utf8.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
        return name.utf8.allSatisfy { $0 == UInt8(ascii: "_") || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
            || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) }
    }
}
