public import Foundation
public import NIOSSL
public import SwiftASN1
import X509
import Crypto
import _CryptoExtras

/// What an APNs client certificate says about itself: the topics it may push to, the
/// environments it is for, its subject and validity.
///
/// APNs reads the base topic from the subject's UID and the others from Apple's topics extension
/// (1.2.840.113635.100.6.3.6: a sequence of topic strings, each followed by a sequence naming its
/// kind: `app`, `voip`, `complication`...). The extensions 1.2.840.113635.100.6.3.1 and ...6.3.2
/// mark a certificate for development (sandbox) and production; one with neither is taken to be
/// for both.
public struct APNsCertificateInfo: Sendable, Equatable {
    /// The subject's UID (the base topic), if it has one.
    public var uid: String?
    /// The subject's organisational unit: the team id on Apple's certificates.
    public var organizationalUnit: String?
    /// The subject's common name.
    public var commonName: String?
    /// The UID first, then the extension's topics, each once.
    public var topics: [String]
    public var development: Bool
    public var production: Bool
    public var notValidBefore: Date
    public var notValidAfter: Date

    public static let uidAttribute: ASN1ObjectIdentifier = [0, 9, 2342, 19_200_300, 100, 1, 1]
    public static let topicsExtension: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 3, 6]
    public static let developmentExtension: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 3, 1]
    public static let productionExtension: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 3, 2]

    /// How the certificate is named in logs and metrics: its UID, else its common name.
    public var subject: String { uid ?? commonName ?? "unnamed certificate" }

    /// Whether the certificate may push to production (else: to the sandbox).
    public func allows(production wanted: Bool) -> Bool {
        wanted ? production : development
    }

    /// Reads a DER certificate.
    public init(derEncoded bytes: [UInt8]) throws(APNsError) {
        let certificate: Certificate
        do {
            certificate = try Certificate(derEncoded: bytes)
        } catch {
            throw .credential("not an X.509 certificate: \(error)")
        }
        for relativeName in certificate.subject {
            for attribute in relativeName {
                switch attribute.type {
                case Self.uidAttribute: uid = uid ?? String(attribute.value)
                case .RDNAttributeType.organizationalUnitName: organizationalUnit = organizationalUnit ?? String(attribute.value)
                case .RDNAttributeType.commonName: commonName = commonName ?? String(attribute.value)
                default: break
                }
            }
        }
        topics = uid.map { [$0] } ?? []
        var development = false, production = false
        for certificateExtension in certificate.extensions {
            switch certificateExtension.oid {
            case Self.topicsExtension:
                for topic in Self.extensionTopics(Array(certificateExtension.value)) where !topics.contains(topic) {
                    topics.append(topic)
                }
            case Self.developmentExtension: development = true
            case Self.productionExtension: production = true
            default: break
            }
        }
        if !development, !production { (development, production) = (true, true) }
        self.development = development
        self.production = production
        notValidBefore = certificate.notValidBefore
        notValidAfter = certificate.notValidAfter
    }

    public init(_ certificate: NIOSSLCertificate) throws(APNsError) {
        let bytes: [UInt8]
        do {
            bytes = try certificate.toDERBytes()
        } catch {
            throw .credential("cannot read the certificate: \(error)")
        }
        try self.init(derEncoded: bytes)
    }

    /// The topic strings of the topics extension's value; an unreadable value names none.
    public static func extensionTopics(_ value: [UInt8]) -> [String] {
        guard let node = try? DER.parse(value), case .constructed(let children) = node.content else { return [] }
        return children.compactMap { child in
            guard child.identifier == .utf8String, let text = try? ASN1UTF8String(derEncoded: child) else { return nil }
            return String(text)
        }
    }

    /// The topics extension's value for `topics` (each marked with the kind APNs gives it), as
    /// Apple's certificates carry it.
    public static func topicsExtensionValue(_ topics: [String]) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.appendConstructedNode(identifier: .sequence) { coder in
            for topic in topics {
                try coder.serialize(ASN1UTF8String(topic))
                try coder.appendConstructedNode(identifier: .sequence) { coder in
                    try coder.serialize(ASN1UTF8String(Self.kind(of: topic, among: topics)))
                }
            }
        }
        return serializer.serializedBytes
    }

    private static func kind(of topic: String, among topics: [String]) -> String {
        guard let base = topics.first, topic != base, topic.hasPrefix(base + ".") else { return "app" }
        return String(topic.dropFirst(base.count + 1))
    }
}

/// A client certificate, its key and what it says (``APNsCertificateInfo``): what a certificate
/// credential connects with.
public struct APNsCertificateIdentity: Sendable {
    public var chain: [NIOSSLCertificate]
    public var key: NIOSSLPrivateKey
    public var info: APNsCertificateInfo

    /// Checks that `key` is the certificate's: the public key made from it is the leaf's.
    public init(chain: [NIOSSLCertificate], key: NIOSSLPrivateKey) throws(APNsError) {
        guard let leaf = chain.first else { throw .credential("no certificate") }
        try Self.check(key, belongsTo: leaf)
        self.chain = chain
        self.key = key
        self.info = try APNsCertificateInfo(leaf)
    }

    /// Throws unless `key`'s public half is `leaf`'s public key. Read with swift-crypto (RSA of
    /// 1,024 bits or more, ECDSA on P-256, P-384, P-521), not by making a TLS context with both:
    /// swift-nio-ssl's `NIOSSLContext` leaks its `SSL_CTX` (and the trust store in it) when it
    /// refuses a key, as it does for every mismatch.
    static func check(_ key: NIOSSLPrivateKey, belongsTo leaf: NIOSSLCertificate) throws(APNsError) {
        let certificateKey: Certificate.PublicKey
        do {
            certificateKey = try Certificate(derEncoded: leaf.toDERBytes()).publicKey
        } catch {
            throw .credential("cannot read the certificate: \(error)")
        }
        let unsupported = APNsError.credential("the key is neither RSA nor ECDSA on P-256, P-384 or P-521")
        // BoringSSL writes no DER for the kinds it cannot (Ed25519 keys, for one).
        guard let der = try? key.derBytes else { throw unsupported }
        let keysPublicHalf: Certificate.PublicKey
        if let p256 = try? P256.Signing.PrivateKey(derRepresentation: der) {
            keysPublicHalf = Certificate.PublicKey(p256.publicKey)
        } else if let p384 = try? P384.Signing.PrivateKey(derRepresentation: der) {
            keysPublicHalf = Certificate.PublicKey(p384.publicKey)
        } else if let p521 = try? P521.Signing.PrivateKey(derRepresentation: der) {
            keysPublicHalf = Certificate.PublicKey(p521.publicKey)
        } else if let rsa = try? _RSA.Signing.PrivateKey(
            unsafePEMRepresentation: PEMDocument(type: "RSA PRIVATE KEY", derBytes: der).pemString) {
            keysPublicHalf = Certificate.PublicKey(rsa.publicKey)
        } else {
            throw unsupported
        }
        guard keysPublicHalf == certificateKey else { throw .credential("the key does not belong to the certificate") }
    }

    /// Reads a PKCS#12 bundle (`.p12`/`.pfx`: `keyFile` nil, optional passphrase) or PEM
    /// certificate and key files.
    public init(certificateFile: String, keyFile: String?, passphrase: String? = nil) throws(APNsError) {
        let chain: [NIOSSLCertificate]
        let key: NIOSSLPrivateKey
        do {
            if let keyFile {
                chain = try NIOSSLCertificate.fromPEMFile(certificateFile)
                guard !chain.isEmpty else { throw APNsError.credential("certificate file \(certificateFile) holds no certificate") }
                if let passphrase {
                    key = try NIOSSLPrivateKey(file: keyFile, format: .pem) { (set: ([UInt8]) -> Void) in set(Array(passphrase.utf8)) }
                } else {
                    key = try NIOSSLPrivateKey(file: keyFile, format: .pem)
                }
            } else {
                let bundle = try NIOSSLPKCS12Bundle(file: certificateFile, passphrase: passphrase.map { Array($0.utf8) })
                (chain, key) = (bundle.certificateChain, bundle.privateKey)
            }
        } catch let error as APNsError {
            throw error
        } catch {
            throw .credential("cannot use certificate \(certificateFile)\(keyFile.map { " with key \($0)" } ?? ""): \(error)")
        }
        do {
            try self.init(chain: chain, key: key)
        } catch {
            throw .credential("certificate \(certificateFile): \(error)")
        }
    }
}
