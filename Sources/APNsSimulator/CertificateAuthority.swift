import APNs
import Crypto
public import Foundation
public import NIOSSL
import SwiftASN1
import X509

/// A certificate authority that issues APNs-style client certificates: the simulator's
/// `--client-ca` trusts it, tests and the demo connect with what it issues.
public struct CertificateAuthority: Sendable {
    /// The authority's own certificate, for ``SimulatorConfiguration/clientCertificateTrustRoots``.
    public let certificate: NIOSSLCertificate
    public let certificatePEM: String
    private let key: P256.Signing.PrivateKey
    private let name: DistinguishedName

    public init(commonName: String = "apns-relay test CA") throws {
        key = P256.Signing.PrivateKey()
        name = try DistinguishedName { CommonName(commonName) }
        let now = Date()
        let made = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(10 * 365 * 86_400),
            issuer: name, subject: name,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                KeyUsage(keyCertSign: true)
            },
            issuerPrivateKey: Certificate.PrivateKey(key))
        certificate = try Self.nioCertificate(made)
        certificatePEM = try made.serializeAsPEM().pemString
    }

    /// A client certificate as Apple issues them: subject UID `uid` (the base topic), OU `team`,
    /// the topics extension listing `topics` (when not empty), the development and production
    /// markers asked for, valid from `notValidBefore` to `notValidAfter`.
    public func issue(uid: String?, team: String? = "TEAM123456", topics: [String] = [],
                      development: Bool = true, production: Bool = true,
                      notValidBefore: Date = Date().addingTimeInterval(-3600),
                      notValidAfter: Date = Date().addingTimeInterval(365 * 86_400)) throws -> SelfSignedIdentity {
        let clientKey = P256.Signing.PrivateKey()
        var attributes: [RelativeDistinguishedName] = []
        if let uid {
            attributes.append(RelativeDistinguishedName(.init(type: APNsCertificateInfo.uidAttribute, utf8String: uid)))
        }
        attributes.append(RelativeDistinguishedName(.init(type: .RDNAttributeType.commonName,
                                                          utf8String: "Apple Push Services: \(uid ?? "none")")))
        if let team {
            attributes.append(RelativeDistinguishedName(.init(type: .RDNAttributeType.organizationalUnitName, utf8String: team)))
        }
        var extensions: [Certificate.Extension] = [
            try Certificate.Extension(KeyUsage(digitalSignature: true), critical: true),
            try Certificate.Extension(ExtendedKeyUsage([.clientAuth]), critical: false),
        ]
        if !topics.isEmpty {
            extensions.append(Certificate.Extension(oid: APNsCertificateInfo.topicsExtension, critical: false,
                                                    value: ArraySlice(try APNsCertificateInfo.topicsExtensionValue(topics))))
        }
        // Apple's markers carry an ASN.1 NULL.
        if development { extensions.append(.init(oid: APNsCertificateInfo.developmentExtension, critical: false, value: [0x05, 0x00])) }
        if production { extensions.append(.init(oid: APNsCertificateInfo.productionExtension, critical: false, value: [0x05, 0x00])) }
        let made = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(clientKey.publicKey),
            notValidBefore: notValidBefore, notValidAfter: notValidAfter,
            issuer: name, subject: DistinguishedName(attributes),
            extensions: try Certificate.Extensions(extensions),
            issuerPrivateKey: Certificate.PrivateKey(key))
        return SelfSignedIdentity(
            chain: [try Self.nioCertificate(made)],
            key: try NIOSSLPrivateKey(bytes: Array(clientKey.derRepresentation), format: .der),
            certificatePEM: try made.serializeAsPEM().pemString,
            privateKeyPEM: clientKey.pemRepresentation)
    }

    private static func nioCertificate(_ certificate: Certificate) throws -> NIOSSLCertificate {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return try NIOSSLCertificate(bytes: serializer.serializedBytes, format: .der)
    }
}
