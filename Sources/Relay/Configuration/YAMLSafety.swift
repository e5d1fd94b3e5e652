import Yams

extension RelayConfiguration {
    /// Yams' constructor, except that integers in base 60 (`1:30`) stay text: Yams computes them
    /// without overflow checks and stops the process past Int's range. No setting is one.
    static func yamlConstructor() -> Constructor {
        var scalars = Constructor.defaultScalarMap
        scalars[.int] = { scalar -> Any? in
            if scalar.string.contains(":") { return scalar.string }
            return Int.construct(from: scalar)
        }
        return Constructor(scalars)
    }

    /// Whether the text may use an alias as (part of) a mapping key — `*a: x`, `[*a]: x`,
    /// `? *a`, `[?*a]` — judged conservatively: an alias followed on its line by a `:`, or any
    /// alias in a document with an explicit key `?` (quoted scalars and comments skipped).
    /// Yams hashes every mapping key while it composes the document, and an alias key stands
    /// for its whole value, which nested aliases make exponentially large: this is checked on
    /// the text, before Yams sees it.
    static func mayUseAliasAsKey(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        var aliases = false, explicitKey = false, aliasOnLine = false
        var quote: UInt8?
        var previous = UInt8(ascii: "\n")
        var index = 0
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }
        func isAnchorCharacter(_ byte: UInt8) -> Bool {
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
        while index < bytes.count {
            let byte = bytes[index]
            if let open = quote {
                if open == UInt8(ascii: "\""), byte == UInt8(ascii: "\\") {
                    index += 2
                    continue
                }
                if byte == open {
                    if open == UInt8(ascii: "'"), index + 1 < bytes.count, bytes[index + 1] == open {
                        index += 2
                        continue
                    }
                    quote = nil
                }
                previous = byte
                index += 1
                continue
            }
            // Indicators can follow `?` and `:` directly in flow collections (`[?*a]`).
            let atTokenStart = isSpace(previous) || previous == UInt8(ascii: "[") || previous == UInt8(ascii: "{")
                || previous == UInt8(ascii: ",") || previous == UInt8(ascii: "?") || previous == UInt8(ascii: ":")
            switch byte {
            case UInt8(ascii: "\n"):
                aliasOnLine = false
            case UInt8(ascii: "#") where isSpace(previous):
                while index + 1 < bytes.count, bytes[index + 1] != UInt8(ascii: "\n") { index += 1 }
            case UInt8(ascii: "\""), UInt8(ascii: "'"):
                if atTokenStart { quote = byte }
            case UInt8(ascii: "*") where atTokenStart && index + 1 < bytes.count && isAnchorCharacter(bytes[index + 1]):
                aliases = true
                aliasOnLine = true
            case UInt8(ascii: "?") where atTokenStart:
                explicitKey = true
            case UInt8(ascii: ":") where aliasOnLine:
                return true
            default:
                break
            }
            previous = byte
            index += 1
        }
        return aliases && explicitKey
    }

    /// Most values (aliases count every time they are used) and the deepest nesting a
    /// configuration may have: far beyond any real one, short of a hang or a stack overflow.
    static let maxYAMLValues = 100_000
    static let maxYAMLDepth = 64

    /// The first thing in the document the relay refuses before making values of it: a mapping
    /// key that is not a plain scalar or a `!!set` (Yams stops the process on those), more values
    /// than ``maxYAMLValues`` or nesting deeper than ``maxYAMLDepth``.
    static func refusal(in root: Node) -> ConfigurationIssue? {
        var budget = maxYAMLValues
        func walk(_ node: Node, _ path: String, _ depth: Int) -> ConfigurationIssue? {
            budget -= 1
            if budget < 0 {
                return ConfigurationIssue(key: "(file)", value: "more than \(maxYAMLValues) values (aliases count each time they are used)",
                                          allowed: "a configuration is far smaller")
            }
            if depth > maxYAMLDepth {
                return ConfigurationIssue(key: "(file)", value: "values nested more than \(maxYAMLDepth) deep (at \(path))",
                                          allowed: "a configuration is far flatter")
            }
            switch node {
            case .mapping(let mapping):
                if node.tag.rawValue == Tag.Name.set.rawValue || mapping.contains(where: { $0.key.scalar == nil }) {
                    return ConfigurationIssue(key: path.isEmpty ? "(file)" : path, value: "a list, a map or a set as a key",
                                              allowed: "keys must be plain values (names)")
                }
                for (key, value) in mapping {
                    let name = key.scalar?.string ?? ""
                    if let found = walk(value, path.isEmpty ? name : path + "." + name, depth + 1) { return found }
                }
            case .sequence(let sequence):
                for (index, item) in sequence.enumerated() {
                    if let found = walk(item, "\(path)[\(index)]", depth + 1) { return found }
                }
            case .scalar, .alias:
                break
            }
            return nil
        }
        return walk(root, "", 0)
    }
}
