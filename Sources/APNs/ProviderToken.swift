public import Crypto
import Foundation
import Common
public import Metrics

/// Where connections get the `authorization: bearer` JWT from.
///
/// One token per (team, key) is shared by every connection of the process; a fleet-wide source
/// (kept in Redis) can replace the local one behind this protocol.
public protocol ProviderTokenSource: Sendable {
    /// The token to send now.
    func currentToken() async throws -> ProviderToken
    /// APNs answered ExpiredProviderToken to `rejected`. Returns the token to retry with: a new
    /// one, unless a token was minted less than 20 minutes ago (then that one).
    func refresh(after rejected: ProviderToken) async throws -> ProviderToken
    /// The token to send now when the source has it at hand (no wait), counted as
    /// ``currentToken()`` counts; nil when only ``currentToken()`` can say.
    func freshToken() -> ProviderToken?
}

extension ProviderTokenSource {
    public func freshToken() -> ProviderToken? { nil }
}

/// One minted provider token.
public struct ProviderToken: Sendable, Equatable {
    public let jwt: String
    /// Its `iat` claim, epoch seconds.
    public let issuedAt: Int64
    /// `bearer <jwt>`, built once per mint rather than once per request.
    public let authorization: String

    public init(jwt: String, issuedAt: Int64) {
        self.jwt = jwt
        self.issuedAt = issuedAt
        self.authorization = "bearer " + jwt
    }
}

extension ProviderTokenSigner {
    /// Counts a minted token that was put in use (`apns_relay_provider_token_mints_total{team_id,key_id}`), for
    /// token sources outside this module.
    public func countMint() {
        APNsMetrics.tokenMinted(teamID: teamID, keyID: keyID)
    }

    /// Reports the token now in use (`apns_relay_provider_token_issued_timestamp_seconds{team_id,key_id}`), for token
    /// sources outside this module.
    public func reportInUse(_ token: ProviderToken) {
        APNsMetrics.tokenInUse(teamID: teamID, keyID: keyID, issuedAt: token.issuedAt)
    }

    /// This key's `apns_relay_provider_token_requests_total{team_id,key_id}` counter: a token source makes it once and
    /// counts every token it hands out for a send.
    public func makeRequestCounter() -> Counter {
        APNsMetrics.tokenRequests(teamID: teamID, keyID: keyID)
    }

    /// Makes this key's series exist at 0 before the first token (so dashboards and alerts see
    /// them from the start).
    public func registerMetrics() {
        APNsMetrics.register(teamID: teamID, keyID: keyID)
    }
}

/// Signs provider tokens: ES256 over `{"alg":"ES256","kid":KEY}.{"iss":TEAM,"iat":SECONDS}`.
public struct ProviderTokenSigner: Sendable {
    public let teamID: String
    public let keyID: String
    private let key: P256.Signing.PrivateKey

    public init(teamID: String, keyID: String, key: P256.Signing.PrivateKey) {
        self.teamID = teamID
        self.keyID = keyID
        self.key = key
    }

    /// Reads a `.p8` file (PKCS#8 PEM, as Apple hands it out).
    public init(teamID: String, keyID: String, keyFile: String) throws(APNsError) {
        self.init(teamID: teamID, keyID: keyID, key: try Self.loadPrivateKey(file: keyFile))
    }

    public static func loadPrivateKey(file: String) throws(APNsError) -> P256.Signing.PrivateKey {
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw .credential("cannot read key file \(file): \(error.localizedDescription)")
        }
        do {
            return try P256.Signing.PrivateKey(pemRepresentation: text)
        } catch {
            throw .credential("key file \(file) is not a PKCS#8 PEM P-256 private key (.p8): \(error)")
        }
    }

    public func mint(issuedAt: Int64) throws -> String {
        let header = Base64URL.encode(Array(#"{"alg":"ES256","kid":"\#(keyID)"}"#.utf8))
        let claims = Base64URL.encode(Array(#"{"iss":"\#(teamID)","iat":\#(issuedAt)}"#.utf8))
        let signingInput = header + "." + claims
        let signature = try key.signature(for: Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(Array(signature.rawRepresentation))
    }
}

/// Mints tokens in this process: a new one after `refreshAge` (default 50 minutes, allowed 20 to
/// 55), never more than once per 20 minutes, and once more when APNs says the token expired.
public final class LocalProviderTokenSource: ProviderTokenSource {
    public static let minimumInterval: Int64 = 20 * 60
    /// How far in the future a token's `iat` may lie and still be used: clocks of a fleet's
    /// hosts differ by this much at most. A token issued later than that (a clock that jumped,
    /// another host's clock ahead) is never "due" by age, so it is replaced at once.
    public static let allowedFutureSkew: Int64 = 60

    /// Whether a token issued at `issuedAt` is still to be used at `now` (epoch seconds): younger
    /// than `refreshAge` and not issued more than ``allowedFutureSkew`` ahead of `now`.
    public static func isFresh(issuedAt: Int64, now: Int64, refreshAge: Int64) -> Bool {
        let age = now - issuedAt
        return age >= -allowedFutureSkew && age < refreshAge
    }
    public static let allowedRefreshAges: ClosedRange<Int64> = (20 * 60)...(55 * 60)

    private struct State {
        var token: ProviderToken?
        var mints = 0
    }

    private let signer: ProviderTokenSigner
    private let refreshAge: Int64
    private let clock: @Sendable () -> Int64
    private let state = Locked(State())
    /// Counts ``currentToken()`` calls (one per `APNsClient.send`); nil when a source wrapping
    /// this one counts them.
    private let requests: Counter?

    /// - Parameters:
    ///   - refreshAgeSeconds: mint again once the token is this old; 1200 to 3300.
    ///   - clock: epoch seconds; injected by tests.
    ///   - countsRequests: count every ``currentToken()`` in `apns_relay_provider_token_requests_total` (false for
    ///     a fallback inside a source that counts).
    public init(signer: ProviderTokenSigner, refreshAgeSeconds: Int64 = 50 * 60,
                clock: @escaping @Sendable () -> Int64 = LocalProviderTokenSource.systemClock,
                countsRequests: Bool = true) throws(APNsError) {
        guard Self.allowedRefreshAges.contains(refreshAgeSeconds) else {
            throw .credential("token refresh age \(refreshAgeSeconds)s is outside 1200...3300 (20 to 55 minutes)")
        }
        self.signer = signer
        self.refreshAge = refreshAgeSeconds
        self.clock = clock
        self.requests = countsRequests ? signer.makeRequestCounter() : nil
    }

    /// Epoch seconds from the system clock.
    @Sendable public static func systemClock() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// How many tokens this source has minted.
    public var mintCount: Int { state.withLock { $0.mints } }

    public func currentToken() throws -> ProviderToken {
        requests?.increment()
        let now = clock()
        return try state.withLock { state in
            if let token = state.token, Self.isFresh(issuedAt: token.issuedAt, now: now, refreshAge: refreshAge) { return token }
            return try mint(&state, now: now)
        }
    }

    public func freshToken() -> ProviderToken? {
        try? currentToken()
    }

    public func refresh(after rejected: ProviderToken) throws -> ProviderToken {
        let now = clock()
        return try state.withLock { state in
            guard let token = state.token else { return try mint(&state, now: now) }
            // Someone already replaced the rejected token, or the current one is too young to
            // replace without angering APNs (TooManyProviderTokenUpdates).
            if token != rejected || Self.isFresh(issuedAt: token.issuedAt, now: now, refreshAge: Self.minimumInterval) { return token }
            return try mint(&state, now: now)
        }
    }

    private func mint(_ state: inout State, now: Int64) throws -> ProviderToken {
        let token = ProviderToken(jwt: try signer.mint(issuedAt: now), issuedAt: now)
        state.token = token
        state.mints += 1
        signer.countMint()
        signer.reportInUse(token)
        return token
    }
}

/// Base64url without padding, as JWTs use it.
public enum Base64URL {
    public static func encode(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    public static func decode(_ text: Substring) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64.append("=") }
        return Data(base64Encoded: base64).map(Array.init)
    }
}
