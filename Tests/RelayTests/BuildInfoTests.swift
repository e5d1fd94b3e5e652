import Foundation
import TestSupport
import Testing

@Suite("What a binary was built from", .timeLimit(.minutes(1)))
struct BuildInfoTests {
    /// The package's root, above Tests/RelayTests.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// `VERSION`'s text and the commit as `git` names it now (nil outside a git checkout).
    static func expected() async throws -> (version: String, commit: String?) {
        let version = try String(contentsOf: root.appendingPathComponent("VERSION"), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let head = try await onOwnThread {
            Result { try runProgram("/usr/bin/git", ["-C", root.path, "rev-parse", "--short=12", "HEAD"]) }
        }.get()
        return (version, head.status == 0 ? head.stdout.trimmingCharacters(in: .whitespacesAndNewlines) : nil)
    }

    /// `line` names `version` and the commit (with `-dirty` if the tree changed since).
    static func names(_ line: String, _ program: String, _ expected: (version: String, commit: String?)) -> Bool {
        guard let commit = expected.commit else { return line == "\(program) \(expected.version) (commit unknown)" }
        return line == "\(program) \(expected.version) (commit \(commit))"
            || line == "\(program) \(expected.version) (commit \(commit)-dirty)"
    }

    @Test func bothExecutablesPrintTheVersionFileAndTheCommit() async throws {
        let expected = try await Self.expected()
        #expect(expected.version.split(separator: ".").count == 3, "\(expected.version)")
        let relay = try await RelayBinary.run(["--version"])
        #expect(relay.status == 0)
        #expect(Self.names(relay.stdout.trimmingCharacters(in: .newlines), "apns-relay", expected), "\(relay.stdout)")
        let dev = try await RelayBinary.runDev(["--version"])
        #expect(dev.status == 0)
        #expect(Self.names(dev.stdout.trimmingCharacters(in: .newlines), "apns-relay-dev", expected), "\(dev.stdout)")
    }

    /// `apns-relay` allocates with jemalloc (linked, Package.swift; docs/performance.md has the
    /// figures): asked to (`MALLOC_CONF`), jemalloc prints its statistics as the process ends,
    /// options first. Its arenas are the two CAllocatorSettings compiles in, whatever the
    /// machine's core count (jemalloc's own default is four per core), and `MALLOC_CONF` still
    /// sets them. Under a sanitizer the sanitizer's allocator comes first, so not there.
    @Test(.disabled(if: sanitizerSlowdown > 1, "a sanitizer's allocator replaces jemalloc"))
    func theRelayAllocatesWithJemallocInTwoArenas() async throws {
        let relay = try await RelayBinary.run(["--version"], environment: ["MALLOC_CONF": "stats_print:true"])
        #expect(relay.status == 0)
        #expect(relay.stderr.contains("Begin jemalloc statistics"), "\(relay.stderr.prefix(300))")
        #expect(relay.stderr.contains("opt.narenas: 2\n"), "\(relay.stderr.prefix(2_000))")
        let three = try await RelayBinary.run(["--version"], environment: ["MALLOC_CONF": "stats_print:true,narenas:3"])
        #expect(three.status == 0)
        #expect(three.stderr.contains("opt.narenas: 3\n"), "\(three.stderr.prefix(2_000))")
        let dev = try await RelayBinary.runDev(["--version"], environment: ["MALLOC_CONF": "stats_print:true"])
        #expect(dev.status == 0)
        #expect(dev.stderr.contains("opt.narenas: 2\n"), "\(dev.stderr.prefix(2_000))")
    }

    /// The chart installs the image of its `appVersion`: the same version the binary reports.
    @Test func theChartsAppVersionIsTheVersionFile() async throws {
        let expected = try await Self.expected()
        let chart = try String(contentsOf: Self.root.appendingPathComponent("charts/apns-relay/Chart.yaml"), encoding: .utf8)
        #expect(chart.contains("appVersion: \"\(expected.version)\""), "\(chart)")
    }
}
