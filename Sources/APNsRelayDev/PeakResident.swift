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
