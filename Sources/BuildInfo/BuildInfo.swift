/// What this binary was built from, set at build time: the package's `VERSION` file and the git
/// commit (`scripts/build-info` writes them before every build; `APNS_RELAY_COMMIT` names the
/// commit where there is no `.git`, as in an image build). `apns-relay --version` prints them,
/// and `/metrics` exports them as `apns_relay_build_info{version,commit} 1`.
public enum BuildInfo {
    /// The `VERSION` file's text, e.g. `0.1.0`.
    public static let version = generatedVersion
    /// Twelve hex digits of the commit, `-dirty` when tracked files differed from it, or
    /// `unknown`.
    public static let commit = generatedCommit
    /// `0.1.0 (commit 0123456789ab)`.
    public static var description: String { "\(version) (commit \(commit))" }
}
