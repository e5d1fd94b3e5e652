public import APNs
import Foundation
import Metrics
public import Logging
public import Redis
import Common
import Synchronization

/// One provider token per (team, key) for the whole fleet, kept in Redis.
///
/// Key `<redis.key_prefix>jwt:{TEAM:KEY}` (`apns-relay:jwt:{TEAM:KEY}` by default; a hash: `jwt`, `iat`; expires after an hour, as the token
/// does). Each process keeps its copy until it is `refreshAge` old, then asks Redis: the stored
/// token if it is younger, else whichever process asks first mints a new one and stores it (one
/// script on one key decides, atomically), and everyone else takes that. A token is replaced no
/// sooner than 20 minutes after the last one, fleet-wide — also after ExpiredProviderToken,
/// when the stored token is the one APNs rejected. A token issued more than a minute ahead of
/// the asking process' clock is replaced at once (``LocalProviderTokenSource/allowedFutureSkew``).
///
/// While Redis is unreachable the process mints for itself under the same rules
/// (``LocalProviderTokenSource``); the fleet-wide 20-minute rule then holds per process only.
public final class RedisProviderTokenSource: ProviderTokenSource {
    /// KEYS[1]: the token hash. ARGV: now, refresh age, minimum interval, candidate jwt ('' to
    /// only look), rejected jwt (''), allowed future skew. Returns {jwt, iat, stored}: stored 1
    /// when the candidate was stored; jwt false when a candidate is needed. A stored token whose
    /// `iat` lies further ahead of `now` than the skew (minted by a host whose clock ran ahead)
    /// is replaced: by age it would never be due.
    static let script = RedisScript(RedisScripts.source(PackageResources.provider_token_lua))

    private let signer: ProviderTokenSigner
    private let redis: RedisClient
    private let keys: RedisKeys
    private let refreshAge: Int64
    private let clock: @Sendable () -> Int64
    private let fallback: LocalProviderTokenSource
    private let logger: Logger
    private let local = Locked<ProviderToken?>(nil)
    /// The one Redis exchange under way, shared by every caller meanwhile (single flight).
    private let asking = Locked<Task<ProviderToken, any Error>?>(nil)
    private let redisFailing = Atomic<Bool>(false)
    private let mints = Atomic<Int>(0)
    /// `apns_relay_provider_token_requests_total` for this key: every ``currentToken()`` (one per send).
    private let requests: Counter

    /// - Parameter keyPrefix: `redis.key_prefix`.
    public init(signer: ProviderTokenSigner, redis: RedisClient, keyPrefix: String, refreshAgeSeconds: Int64 = 50 * 60,
                clock: @escaping @Sendable () -> Int64 = LocalProviderTokenSource.systemClock,
                logger: Logger = Logger(label: "apns-relay.jwt")) throws(APNsError) {
        self.signer = signer
        self.redis = redis
        self.keys = RedisKeys(prefix: keyPrefix)
        self.refreshAge = refreshAgeSeconds
        self.clock = clock
        self.logger = logger
        self.fallback = try LocalProviderTokenSource(signer: signer, refreshAgeSeconds: refreshAgeSeconds, clock: clock,
                                                     countsRequests: false)
        self.requests = signer.makeRequestCounter()
    }

    var key: String { keys.providerToken(teamID: signer.teamID, keyID: signer.keyID) }

    /// Tokens this process minted and stored (or minted for itself while Redis failed).
    public var mintCount: Int { mints.load(ordering: .relaxed) + fallback.mintCount }

    public func freshToken() -> ProviderToken? {
        let now = clock()
        guard let token = local.withLock({ $0 }),
              LocalProviderTokenSource.isFresh(issuedAt: token.issuedAt, now: now, refreshAge: refreshAge) else { return nil }
        requests.increment()
        return token
    }

    public func currentToken() async throws -> ProviderToken {
        requests.increment()
        let now = clock()
        if let token = local.withLock({ $0 }),
           LocalProviderTokenSource.isFresh(issuedAt: token.issuedAt, now: now, refreshAge: refreshAge) { return token }
        let task = asking.withLock { asking in
            if let running = asking { return running }
            let started = Task { try await self.shared(now: now, rejected: nil) }
            asking = started
            return started
        }
        defer { asking.withLock { if $0 == task { $0 = nil } } }
        return try await task.value
    }

    public func refresh(after rejected: ProviderToken) async throws -> ProviderToken {
        try await shared(now: clock(), rejected: rejected)
    }

    /// Asks Redis for the fleet's token, minting and offering one when Redis says it is due.
    private func shared(now: Int64, rejected: ProviderToken?) async throws -> ProviderToken {
        do {
            var token = try await ask(now: now, candidate: nil, rejected: rejected)
            if token == nil {
                let candidate = ProviderToken(jwt: try signer.mint(issuedAt: now), issuedAt: now)
                token = try await ask(now: now, candidate: candidate, rejected: rejected)
            }
            guard let token else { throw RedisError.protocolError("the token script stored nothing") }
            if redisFailing.exchange(false, ordering: .relaxed) {
                logger.warning("provider tokens come from Redis again", metadata: ["apns.team_id": "\(signer.teamID)"])
            }
            local.withLock { $0 = token }
            signer.reportInUse(token)
            return token
        } catch let error as RedisError {
            if !redisFailing.exchange(true, ordering: .relaxed) {
                logger.error("Redis unreachable: minting provider tokens in this process", metadata: [
                    "apns.team_id": "\(signer.teamID)", "redis.error": "\(error)",
                ])
            }
            let token = try rejected.map { try fallback.refresh(after: $0) } ?? fallback.currentToken()
            local.withLock { $0 = token }
            return token
        }
    }

    /// Runs the script; nil when Redis wants a candidate.
    private func ask(now: Int64, candidate: ProviderToken?, rejected: ProviderToken?) async throws(RedisError) -> ProviderToken? {
        let reply = try await redis.evaluate(Self.script, keys: [key], arguments: [
            Int(now), Int(refreshAge), Int(LocalProviderTokenSource.minimumInterval),
            candidate?.jwt ?? "", rejected?.jwt ?? "", Int(LocalProviderTokenSource.allowedFutureSkew),
        ])
        guard let fields = reply.array, fields.count == 3 else { throw .protocolError("token script answered \(reply)") }
        guard let jwt = fields[0].string, let issuedAt = fields[1].integer else { return nil }
        if fields[2].integer == 1 {
            mints.add(1, ordering: .relaxed)
            signer.countMint()
        }
        return ProviderToken(jwt: jwt, issuedAt: issuedAt)
    }
}
