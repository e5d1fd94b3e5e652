import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#endif

/// How a connection names what went wrong, in its logs and in the errors it fails with: a
/// failed connect by its target and the system's word for it, and a GOAWAY by APNs' reason.
extension APNsConnection {
    static func describe(_ error: any Error) -> String {
        if let error = error as? NIOConnectionError {
            if let first = error.connectionErrors.first {
                let target = "\(first.target.ipAddress ?? error.host):\(first.target.port ?? error.port)"
                if let io = first.error as? IOError {
                    return "cannot connect to \(target): \(String(cString: strerror(io.errnoCode)))"
                }
                return "cannot connect to \(target): \(first.error)"
            }
            if let dns = error.dnsAError ?? error.dnsAAAAError {
                return "cannot resolve \(error.host): \(dns)"
            }
            return "cannot connect to \(error.host):\(error.port)"
        }
        if let error = error as? ChannelError, case .connectTimeout(let amount) = error {
            return "connect timed out after \(amount.nanoseconds / 1_000_000) ms"
        }
        return String(describing: error)
    }

    /// APNs puts `{"reason":"..."}` in GOAWAY's debug data.
    static func goAwayReason(_ debugData: String) -> String {
        if let range = debugData.range(of: #""reason":""#),
           let end = debugData[range.upperBound...].firstIndex(of: "\"") {
            return String(debugData[range.upperBound..<end])
        }
        return debugData.isEmpty ? "none" : debugData
    }
}
