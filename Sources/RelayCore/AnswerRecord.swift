/// What the dedupe record (``RedisKeys/seen(token:topic:id:)``) keeps of APNs' answer to an
/// intent, so that a redelivery's `duplicate` outcome says what the answer was: a 410 is never
/// lost behind a bare `duplicate`.
///
/// Stored as one line: `2 <status> <http status> <unregistered_at> <apns-id> <reason>`, `-` for
/// what the answer did not have (the reason, last, is never split). Records written before this
/// format hold the status alone; they still read, with the rest unknown.
public struct AnswerRecord: Sendable, Equatable {
    /// `delivered`, `rejected` or `unregistered`.
    package var status: String
    package var httpStatus: Int?
    package var unregisteredAt: Int64?
    package var apnsID: String?
    package var reason: String?

    package init(status: String, httpStatus: Int? = nil, unregisteredAt: Int64? = nil, apnsID: String? = nil, reason: String? = nil) {
        self.status = status
        self.httpStatus = httpStatus
        self.unregisteredAt = unregisteredAt
        self.apnsID = apnsID
        self.reason = reason
    }

    package init(_ outcome: Outcome) {
        self.init(status: outcome.status.rawValue, httpStatus: outcome.httpStatus, unregisteredAt: outcome.unregisteredAt,
                  apnsID: outcome.apnsID, reason: outcome.reason)
    }

    /// The record as Redis keeps it (`2 status http unregistered_at apns_id reason`, `-` for a
    /// field it has not), written onto `bytes`: the dedupe record's `SET` takes it straight into
    /// its command (no string of it is made).
    package func write(into bytes: inout [UInt8]) {
        // Bytes, not `contains(" ")`: that resolves to Foundation's string search, which took
        // about 1% of the relay's CPU with the policy on.
        func put(_ value: String?) {
            bytes.append(UInt8(ascii: " "))
            guard let value, !value.isEmpty, !value.utf8.contains(UInt8(ascii: " ")) else { return bytes.append(UInt8(ascii: "-")) }
            bytes.append(contentsOf: value.utf8)
        }
        bytes.append(UInt8(ascii: "2"))
        put(status)
        put(httpStatus.map(String.init))
        put(unregisteredAt.map(String.init))
        put(apnsID)
        bytes.append(UInt8(ascii: " "))
        // The last field takes what follows the fifth space: spaces included.
        if let reason, !reason.isEmpty { bytes.append(contentsOf: reason.utf8) } else { bytes.append(UInt8(ascii: "-")) }
    }

    /// The record as Redis keeps it, as a string (``write(into:)``).
    package var encoded: String {
        var bytes: [UInt8] = []
        write(into: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Nil for a value that is neither format.
    package init?(_ text: String) {
        let parts = text.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: false)
        if parts.count == 1 {
            guard !text.isEmpty, !text.utf8.contains(UInt8(ascii: " ")) else { return nil }
            self.init(status: text)
            return
        }
        guard parts.count == 6, parts[0] == "2", !parts[1].isEmpty, parts[1] != "-" else { return nil }
        func value(_ part: Substring) -> String? { part == "-" || part.isEmpty ? nil : String(part) }
        self.init(status: String(parts[1]), httpStatus: value(parts[2]).flatMap { Int($0) },
                  unregisteredAt: value(parts[3]).flatMap { Int64($0) }, apnsID: value(parts[4]), reason: value(parts[5]))
    }
}
