public import Foundation
import Common

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Cheap random `apns-id`s, and the checks around them.
///
/// Foundation's `UUID()` opens and reads the kernel's random source on every call; at APNs rates
/// that dominates, so identifiers come from a SplitMix64 stream seeded once from the system.
/// They are unique identifiers, not secrets.
public struct APNsIdentifiers: Sendable {
    private var state: UInt64 = UInt64.random(in: .min ... .max)
    private static let upperHex = Array("0123456789ABCDEF".utf8)
    private static let lowerHex = Array("0123456789abcdef".utf8)
    private static let shared = Locked(APNsIdentifiers())

    public init() {}

    /// A random (version 4) UUID from the process-wide stream.
    public static func randomUUID() -> UUID {
        let (high, low) = shared.withLock { ($0.nextWord(), $0.nextWord()) }
        return uuid(high: high, low: low)
    }

    /// A random (version 4) UUID in canonical upper-case form, as APNs writes them.
    public mutating func next() -> String {
        let uuid = Self.uuid(high: nextWord(), low: nextWord())
        return Self.format(uuid, upperCase: true)
    }

    /// A UUID from 128 bits, with the RFC 9562 variant and the given version (4: random,
    /// 8: custom) stamped in.
    public static func uuid(high: UInt64, low: UInt64, version: UInt64 = 4) -> UUID {
        let h = (high & 0xFFFF_FFFF_FFFF_0FFF) | (version & 0xF) << 12
        let l = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
        func byte(_ word: UInt64, _ index: Int) -> UInt8 { UInt8(truncatingIfNeeded: word >> UInt64(56 - 8 * index)) }
        return UUID(uuid: (byte(h, 0), byte(h, 1), byte(h, 2), byte(h, 3), byte(h, 4), byte(h, 5), byte(h, 6), byte(h, 7),
                           byte(l, 0), byte(l, 1), byte(l, 2), byte(l, 3), byte(l, 4), byte(l, 5), byte(l, 6), byte(l, 7)))
    }

    /// 8-4-4-4-12 hex digits with dashes, without going through `String(format:)`.
    public static func format(_ uuid: UUID, upperCase: Bool = false) -> String {
        let digits = upperCase ? upperHex : lowerHex
        return withUnsafeBytes(of: uuid.uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { buffer in
                var index = 0
                for position in 0..<16 {
                    if position == 4 || position == 6 || position == 8 || position == 10 {
                        buffer[index] = UInt8(ascii: "-")
                        index += 1
                    }
                    let byte = bytes[position]
                    buffer[index] = digits[Int(byte >> 4)]
                    buffer[index + 1] = digits[Int(byte & 0xF)]
                    index += 2
                }
                return 36
            }
        }
    }

    private mutating func nextWord() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// 8-4-4-4-12 hex digits with dashes, either case.
    public static func isCanonicalUUID(_ text: String) -> Bool {
        var count = 0
        for byte in text.utf8 {
            switch count {
            case 8, 13, 18, 23:
                guard byte == UInt8(ascii: "-") else { return false }
            default:
                let isHex = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x46) || (byte >= 0x61 && byte <= 0x66)
                guard isHex else { return false }
            }
            count += 1
            if count > 36 { return false }
        }
        return count == 36
    }

    /// Milliseconds since the epoch.
    public static func epochMilliseconds() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }
}
