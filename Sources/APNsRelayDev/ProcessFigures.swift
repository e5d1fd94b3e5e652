import ArgumentParser
import CommandLineSupport
import Foundation

/// Peak resident set size of this process (or of the one whose /proc status file is given), in
/// MiB (Linux: VmHWM).
func peakResidentMiB(status file: String = "/proc/self/status") -> Double? {
    guard let status = try? String(contentsOfFile: file, encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        let kilobytes = line.split(separator: " ").compactMap { Double($0) }.first
        return kilobytes.map { $0 / 1024 }
    }
    return nil
}

/// The executable `name` in this one's directory (the build puts both products there); says so
/// and exits when it is not there.
func siblingExecutable(_ name: String) throws -> String {
    let path = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        .deletingLastPathComponent().appendingPathComponent(name).path
    guard FileManager.default.isExecutableFile(atPath: path) else {
        Terminal.error("no \(name) next to this executable (\(path)): build both products")
        throw ExitCode(1)
    }
    return path
}

/// This process's CPU time so far (user + system), in seconds.
enum ProcessCPU {
    static func now() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1_000_000 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}

/// Allocations this process has asked for so far, from jemalloc's statistics (the executables
/// link it, Package.swift): its small and large allocation requests, every arena and every
/// thread's cache. Nil where the allocator is not jemalloc. A thread's cache reports its
/// requests when it fills from or flushes to its arena (its periodic collection included), so a
/// figure lags by at most a few caches' worth: nothing against the millions of a benchmark run.
enum ProcessAllocations {
    private typealias Mallctl = @convention(c) (UnsafePointer<CChar>?, UnsafeMutableRawPointer?, UnsafeMutablePointer<Int>?,
                                                UnsafeMutableRawPointer?, Int) -> Int32

    /// jemalloc's `mallctl`, looked up in the running process (no header or link-time name).
    private static let mallctl: Mallctl? = dlopen(nil, RTLD_NOW).flatMap { dlsym($0, "mallctl") }.map {
        unsafeBitCast($0, to: Mallctl.self)
    }

    static func now() -> UInt64? {
        guard let mallctl else { return nil }
        // Writing the epoch refreshes the statistics the reads below return.
        var epoch: UInt64 = 1
        guard mallctl("epoch", nil, nil, &epoch, MemoryLayout<UInt64>.size) == 0 else { return nil }
        var total: UInt64 = 0
        // 4096: MALLCTL_ARENAS_ALL, every arena merged.
        for name in ["stats.arenas.4096.small.nrequests", "stats.arenas.4096.large.nrequests"] {
            var value: UInt64 = 0
            var length = MemoryLayout<UInt64>.size
            guard mallctl(name, &value, &length, nil, 0) == 0 else { return nil }
            total += value
        }
        return total
    }
}

/// Another process's figures, from its /proc entry (nil when it is gone or unreadable).
enum ProcessFigures {
    /// CPU time so far (user + system), in seconds: fields 14 and 15 of /proc/PID/stat, in clock
    /// ticks. The fields are counted after the command's closing parenthesis, as the command
    /// may hold spaces.
    static func cpuSeconds(of pid: Int32) -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // fields[0] is field 3 (the state).
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Peak resident set size (VmHWM), in MiB.
    static func peakResidentMiB(of pid: Int32) -> Double? {
        APNsRelayDev.peakResidentMiB(status: "/proc/\(pid)/status")
    }
}
