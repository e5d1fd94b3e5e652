/// URLs as they may be shown: in logs, errors and `check-config`.
public enum URLCredentials {
    /// `text` with the credentials of its user part replaced by `<redacted>`: everything from
    /// the first `:` of the user part to its last `@` (`https://user:<redacted>@host`), or the
    /// whole user part when it has no `:` (`https://<redacted>@host`: a lone user part is often a
    /// token). The user part starts after `//`, or at the start when the scheme is missing, and
    /// ends at the last `@` before the path. Whatever the text (a URL that does not parse
    /// included), no part of a password shows.
    public static func redacted(_ text: String) -> String {
        let start = Self.afterScheme(text)
        // The authority ends at the path, query or fragment; a password may hold `/`, so an `@`
        // after it still counts (the last `@` of the whole text).
        guard let at = text[start...].lastIndex(of: "@") else { return text }
        if let colon = text[start..<at].firstIndex(of: ":") {
            return String(text[...colon]) + "<redacted>" + String(text[at...])
        }
        return String(text[..<start]) + "<redacted>" + String(text[at...])
    }

    /// Where the part after `//` starts, or the start when there is no `//`.
    private static func afterScheme(_ text: String) -> String.Index {
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(after: index)
            if text[index] == "/", next < text.endIndex, text[next] == "/" { return text.index(after: next) }
            index = next
        }
        return text.startIndex
    }
}
