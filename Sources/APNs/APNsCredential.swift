public import NIOSSL

/// How a client proves who it is to APNs.
public enum APNsCredential: Sendable {
    /// Token auth: every request carries `authorization: bearer <JWT>` from this source.
    case token(any ProviderTokenSource)
    /// Certificate auth: a TLS client certificate; no authorization header.
    case certificate(chain: [NIOSSLCertificate], key: NIOSSLPrivateKey)

    /// Token auth from a `.p8` file, minted in this process.
    public static func token(teamID: String, keyID: String, keyFile: String,
                             refreshAgeSeconds: Int64 = 50 * 60) throws(APNsError) -> APNsCredential {
        let signer = try ProviderTokenSigner(teamID: teamID, keyID: keyID, keyFile: keyFile)
        return .token(try LocalProviderTokenSource(signer: signer, refreshAgeSeconds: refreshAgeSeconds))
    }

    /// Certificate auth from a PKCS#12 bundle (`.p12`/`.pfx`, `keyFile` nil, optional passphrase)
    /// or from PEM certificate and key files.
    public static func certificate(certificateFile: String, keyFile: String?, passphrase: String? = nil) throws(APNsError) -> APNsCredential {
        let identity = try APNsCertificateIdentity(certificateFile: certificateFile, keyFile: keyFile, passphrase: passphrase)
        return .certificate(chain: identity.chain, key: identity.key)
    }
}
