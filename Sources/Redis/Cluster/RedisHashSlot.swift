/// Redis Cluster's key space: 16,384 hash slots, a key's slot being the CRC16 (XMODEM) of its
/// hash tag — the part between the first `{` and the first `}` after it, when that part is not
/// empty — or of the whole key, modulo 16,384 (the cluster specification's `HASH_SLOT`).
public enum RedisHashSlot {
    public static let count = 16_384

    /// The slot of `key`.
    public static func of(_ key: some Collection<UInt8>) -> Int {
        if let open = key.firstIndex(of: UInt8(ascii: "{")) {
            let afterOpen = key.index(after: open)
            if let close = key[afterOpen...].firstIndex(of: UInt8(ascii: "}")), close != afterOpen {
                return Int(crc16(key[afterOpen..<close]) & 0x3FFF)
            }
        }
        return Int(crc16(key) & 0x3FFF)
    }

    public static func of(_ key: String) -> Int { of(Array(key.utf8)) }

    /// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis computes it.
    static func crc16(_ bytes: some Collection<UInt8>) -> UInt16 {
        var crc: UInt16 = 0
        for byte in bytes {
            crc = (crc << 8) ^ table[Int((crc >> 8) ^ UInt16(byte)) & 0xFF]
        }
        return crc
    }

    private static let table: [UInt16] = (0..<256).map { index in
        var crc = UInt16(index) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }
}
