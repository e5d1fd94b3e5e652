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

    package var encoded: String {
        // Bytes, not `contains(" ")`: that resolves to Foundation's string search, which took
        // about 1% of the relay's CPU with the policy on.
        func field(_ value: String?) -> String {
            guard let value, !value.isEmpty, !value.utf8.contains(UInt8(ascii: " ")) else { return "-" }
            return value
        }
        // Written into one string of its exact length: one allocation (interpolating and
        // joining two halves took three per record).
        let fields = (field(status), field(httpStatus.map(String.init)), field(unregisteredAt.map(String.init)),
                      field(apnsID), reason.map { $0.isEmpty ? "-" : $0 } ?? "-")
        let length = 6 + fields.0.utf8.count + fields.1.utf8.count + fields.2.utf8.count + fields.3.utf8.count + fields.4.utf8.count
        return String(unsafeUninitializedCapacity: length) { buffer in
            var end = 0
            func put(_ text: String) {
                buffer[end] = UInt8(ascii: " ")
                end += 1
                for byte in text.utf8 {
                    buffer[end] = byte
                    end += 1
                }
            }
            buffer[0] = UInt8(ascii: "2")
            end = 1
            put(fields.0)
            put(fields.1)
            put(fields.2)
            put(fields.3)
            put(fields.4)
            return end
        }
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
