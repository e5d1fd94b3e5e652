import Foundation

/// Peak resident set size of this process, in MiB (Linux: VmHWM).
func peakResidentMiB() -> Double? {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        let kilobytes = line.split(separator: " ").compactMap { Double($0) }.first
        return kilobytes.map { $0 / 1024 }
    }
    return nil
}
