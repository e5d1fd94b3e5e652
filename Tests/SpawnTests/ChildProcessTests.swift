import Foundation
import Testing
import Spawn

@Suite("Child processes", .timeLimit(.minutes(3)))
struct ChildProcessTests {
    @Test func theChildGetsItsStreamsAndNoOtherDescriptor() throws {
        // A descriptor that would be inherited (no close-on-exec), as a C library might leave one.
        var leaky: [Int32] = [0, 0]
        try #require(pipe(&leaky) == 0)
        defer { for descriptor in leaky { close(descriptor) } }
        let out = try ChildProcess.makePipe()
        let child = try ChildProcess(executable: "/bin/sh", arguments: ["-c", "ls /proc/self/fd; echo done >&2"],
                                     standardOutput: out.write, standardError: out.write)
        close(out.write)
        let printed = String(decoding: ChildProcess.readToEnd(out.read), as: UTF8.self)
        #expect(child.wait() == 0)
        let descriptors = Set(printed.split(separator: "\n").compactMap { Int32($0) })
        // 0, 1, 2 and the directory `ls` reads.
        #expect(descriptors.isSubset(of: [0, 1, 2, 3]), "\(printed)")
        #expect(printed.hasSuffix("done\n"))
        #expect(!child.isRunning)
    }

    @Test func theChildGetsThisEnvironmentWithTheOverridesSet() throws {
        let path = try #require(ProcessInfo.processInfo.environment["PATH"])
        let out = try ChildProcess.makePipe()
        let child = try ChildProcess(executable: "/bin/sh", arguments: ["-c", #"echo "$APNS_RELAY_TEST_X|$PATH|$HOME""#],
                                     standardOutput: out.write,
                                     environment: ["APNS_RELAY_TEST_X": "a b=c", "HOME": "/nowhere"])
        close(out.write)
        let printed = String(decoding: ChildProcess.readToEnd(out.read), as: UTF8.self)
        #expect(child.wait() == 0)
        #expect(printed == "a b=c|\(path)|/nowhere\n")
    }

    @Test func theChildStartsWithNoSignalBlockedOrIgnored() throws {
        // Whatever this thread blocks and this process ignores, the child may be stopped.
        var blocked = sigset_t(), previous = sigset_t()
        sigemptyset(&blocked)
        sigaddset(&blocked, SIGTERM)
        pthread_sigmask(SIG_BLOCK, &blocked, &previous)
        // Ignored for the rest of the process (a test process has no use for SIGPIPE): putting
        // the old disposition back could undo an ignore another test relies on meanwhile.
        signal(SIGPIPE, SIG_IGN)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        let out = try ChildProcess.makePipe()
        let child = try ChildProcess(executable: "/bin/sh", arguments: ["-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status"],
                                     standardOutput: out.write)
        close(out.write)
        let printed = String(decoding: ChildProcess.readToEnd(out.read), as: UTF8.self)
        #expect(child.wait() == 0)
        let masks = Dictionary(uniqueKeysWithValues: printed.split(separator: "\n").map { line in
            let parts = line.split(separator: ":").map { $0.trimmingCharacters(in: .whitespaces) }
            return (parts[0], UInt64(parts[1], radix: 16) ?? .max)
        })
        #expect(masks["SigBlk"] == 0, "\(printed)")
        let ignoredSignals = try #require(masks["SigIgn"])
        #expect(ignoredSignals & (1 << (UInt64(SIGPIPE) - 1)) == 0, "\(printed)")
        #expect(ignoredSignals & (1 << (UInt64(SIGTERM) - 1)) == 0, "\(printed)")
    }

    @Test func exitCodesAndSignalsAreReported() throws {
        #expect(try ChildProcess(executable: "/bin/sh", arguments: ["-c", "exit 3"]).wait() == 3)
        let sleeper = try ChildProcess(executable: "/bin/sleep", arguments: ["30"])
        #expect(sleeper.isRunning)
        sleeper.signal(SIGKILL)
        #expect(sleeper.wait() == 128 + SIGKILL)
        #expect(!sleeper.isRunning)
        #expect(throws: ChildProcess.SpawnError.self) { try ChildProcess(executable: "/nonexistent/program", arguments: []) }
    }
}
