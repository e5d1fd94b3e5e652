import Common
internal import CSpawn
#if canImport(Glibc)
internal import Glibc
#endif
internal import Synchronization

/// A child process started with `posix_spawn`: its standard input, output and error are the
/// descriptors given (or this process's own), and every other descriptor is closed in the child
/// by `closefrom`, without listing them.
///
/// Not Foundation's `Process`: on this toolchain it lists `/proc/self/fd` before each start,
/// and with more than about 1,350 descriptors open (a test process running many clients in
/// parallel) its copy of a directory entry can read past the end of glibc's buffer and crash
/// the parent.
public final class ChildProcess: Sendable {
    public let pid: Int32
    /// The exit code once it was reaped.
    private let ended = Locked<Int32?>(nil)

    public struct SpawnError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Starts `executable` with `arguments`. A nil descriptor leaves that stream this process's.
    /// The child's environment is this process's with `environment` set over it.
    public init(executable: String, arguments: [String], standardInput: Int32? = nil,
                standardOutput: Int32? = nil, standardError: Int32? = nil,
                environment: [String: String] = [:]) throws(SpawnError) {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (descriptor, target) in [(standardInput, Int32(0)), (standardOutput, 1), (standardError, 2)] {
            guard let descriptor else { continue }
            posix_spawn_file_actions_adddup2(&actions, descriptor, target)
        }
        posix_spawn_file_actions_addclosefrom_np(&actions, 3)
        // The child starts with no signal blocked and the usual stop signals at their defaults,
        // whatever the spawning thread blocks or this process ignores (SIGPIPE, say).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), defaults = sigset_t()
        sigemptyset(&none)
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        var pid: pid_t = 0
        let envp = Self.environment(overriding: environment)
        defer { for variable in envp { free(variable) } }
        let result = Self.spawning.withLock { _ in
            envp.isEmpty
                ? posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
                : posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        }
        guard result == 0 else {
            throw SpawnError(description: "cannot start \(executable): \(String(cString: strerror(result)))")
        }
        self.pid = pid
    }

    /// Held while a child starts: from its `clone` until its `exec` (glibc's `posix_spawn`
    /// returns only then) the child holds a copy of every descriptor of this process, so a
    /// socket this process closes meanwhile stays open, and listened on, for that moment.
    private static let spawning = Locked<Void>(())

    /// Runs `body` while no child is starting, so that a socket closed in it is closed at once:
    /// a listener closed and bound again on its port (as librdkafka's mock broker does when it
    /// is taken down) would otherwise find the port still listened on by a child's copy, and
    /// fail with `EADDRINUSE`. `body` must not start a child itself (the lock is not reentrant).
    public static func withoutChildrenStarting<Result>(_ body: () throws -> Result) rethrows -> Result {
        try spawning.withLock { _ in try body() }
    }

    /// This process's environment with `overrides` set, as `NAME=value` strings and a final nil;
    /// empty when there is nothing to override (the child then gets `environ` itself).
    private static func environment(overriding overrides: [String: String]) -> [UnsafeMutablePointer<CChar>?] {
        guard !overrides.isEmpty else { return [] }
        var variables: [String] = []
        var pointer = environ
        while let entry = pointer.pointee {
            let variable = String(cString: entry)
            let name = variable.split(separator: "=", maxSplits: 1).first.map(String.init) ?? variable
            if overrides[name] == nil { variables.append(variable) }
            pointer += 1
        }
        variables += overrides.map { "\($0.key)=\($0.value)" }
        return variables.map { strdup($0) } + [nil]
    }

    /// Starts `executable` with its standard output and error into one new pipe: the process
    /// and the pipe's read end (the caller reads and closes it).
    public static func capturingOutput(executable: String, arguments: [String]) throws(SpawnError) -> (process: ChildProcess, output: Int32) {
        let pipe = try makePipe()
        defer { close(pipe.write) }
        do {
            let process = try ChildProcess(executable: executable, arguments: arguments,
                                           standardOutput: pipe.write, standardError: pipe.write)
            return (process, pipe.read)
        } catch {
            close(pipe.read)
            throw error
        }
    }

    /// A pipe whose two ends close on exec (hand one to the child as a standard stream).
    public static func makePipe() throws(SpawnError) -> (read: Int32, write: Int32) {
        var ends: [Int32] = [0, 0]
        guard pipe2(&ends, O_CLOEXEC) == 0 else {
            throw SpawnError(description: "cannot make a pipe: \(String(cString: strerror(errno)))")
        }
        return (ends[0], ends[1])
    }

    /// Reads a descriptor to its end, then closes it.
    public static func readToEnd(_ descriptor: Int32) -> [UInt8] {
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count > 0 {
                bytes.append(contentsOf: chunk[..<count])
            } else if count == 0 || errno != EINTR {
                return bytes
            }
        }
    }

    public func signal(_ signal: Int32) {
        guard ended.withLock({ $0 == nil }) else { return }
        kill(pid, signal)
    }

    /// Blocks until it exits: its exit code, or 128 + the signal that ended it.
    @discardableResult
    public func wait() -> Int32 {
        var status: Int32 = 0
        while true {
            if let code = ended.withLock({ $0 }) { return code }
            let reaped = waitpid(pid, &status, 0)
            if reaped == pid { return record(status) }
            if errno != EINTR { return ended.withLock { $0 } ?? -1 }
        }
    }

    /// Whether it has not exited yet (reaping it if it has).
    public var isRunning: Bool {
        if ended.withLock({ $0 }) != nil { return false }
        var status: Int32 = 0
        guard waitpid(pid, &status, WNOHANG) == pid else { return ended.withLock { $0 } == nil }
        record(status)
        return false
    }

    @discardableResult
    private func record(_ status: Int32) -> Int32 {
        let signal = status & 0x7f
        let code = signal == 0 ? (status >> 8) & 0xff : 128 + signal
        ended.withLock { $0 = code }
        return code
    }
}
