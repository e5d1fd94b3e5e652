import Foundation
import Fuzzing
import Testing

/// Every seed of every fuzz target, and every input that once made a target fail, replayed
/// through the target as the fuzzer runs it (`Fuzz/corpus/TARGET`, `Fuzz/regressions/TARGET`).
/// A target that crashes stops the test process: the crash names the file last replayed.
@Suite("Fuzz corpora", .timeLimit(.minutes(3)))
struct FuzzCorpusTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz")

    static func inputs(_ kind: String, _ target: FuzzTarget) -> [URL] {
        let directory = root.appendingPathComponent(kind).appendingPathComponent(target.rawValue)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.sorted().filter { !$0.hasPrefix(".") }.map { directory.appendingPathComponent($0) }
    }

    @Test(arguments: FuzzTarget.allCases)
    func everySeedRuns(_ target: FuzzTarget) throws {
        let seeds = Self.inputs("corpus", target)
        #expect(seeds.count >= 3, "target \(target.rawValue) has \(seeds.count) seeds")
        for seed in seeds { target.run(Array(try Data(contentsOf: seed))) }
    }

    /// The seeds reach what they are for: a target that stopped short of its work (a client that
    /// never completes a response, a decoder that reads nothing) would fuzz only its front door.
    @Test(arguments: [
        (FuzzTarget.intent, "alert", 1), (.intent, "everything", 1), (.intent, "invalid-utf8", 0), (.intent, "voip-large", 1),
        (.intent, "channel", 1),
        (.resp, "simple", 5), (.resp, "arrays", 2), (.resp, "in-pieces", 1),
        (.http2Client, "answers", 3), (.http2Client, "answers-in-pieces", 3), (.http2Client, "limit-then-goaway", 1),
        (.http2Client, "reset-ping-split-body", 1),
        (.configuration, "shipped", 1), (.configuration, "wrong-types", 0),
    ])
    func seedsGetWhereTheyShould(_ target: FuzzTarget, _ seed: String, _ reached: Int) throws {
        let file = Self.root.appendingPathComponent("corpus").appendingPathComponent(target.rawValue).appendingPathComponent(seed)
        #expect(target.run(Array(try Data(contentsOf: file))) == reached)
    }

    /// The simulator answers requests: three requests get more back than a bare settings exchange.
    @Test func theSimulatorAnswersItsSeed() throws {
        let directory = Self.root.appendingPathComponent("corpus").appendingPathComponent("simulator")
        let answered = FuzzTarget.simulator.run(Array(try Data(contentsOf: directory.appendingPathComponent("three-requests"))))
        let bare = FuzzTarget.simulator.run([])
        #expect(answered > bare + 3 * 20)
    }

    @Test(arguments: FuzzTarget.allCases)
    func everyRegressionRuns(_ target: FuzzTarget) throws {
        for input in Self.inputs("regressions", target) { target.run(Array(try Data(contentsOf: input))) }
    }
}
