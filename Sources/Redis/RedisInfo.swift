/// The text of an `INFO` reply: `field:value` lines, `# Section` headers and blank lines between
/// them, each line ended by CRLF.
public enum RedisInfo {
    /// Its fields by name (a header, or any line without a colon, is left out; a value keeps
    /// what follows the first colon).
    public static func fields(_ text: String) -> [Substring: Substring] {
        var fields: [Substring: Substring] = [:]
        for line in text.split(whereSeparator: \.isNewline) {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields[line[..<colon]] = line[line.index(after: colon)...]
        }
        return fields
    }
}
