import Foundation

/// A JSON value as it was written: `true` stays a boolean and `1` an integer (Foundation's
/// `JSONSerialization` gives `NSNumber` for both).
public enum JSONValue: Decodable, Equatable, Sendable, CustomStringConvertible {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int64.self) { self = .integer(value) }
        else if let value = try? container.decode(Double.self) { self = .number(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([JSONValue].self) { self = .array(value) }
        else { self = .object(try container.decode([String: JSONValue].self)) }
    }

    public init(parsing bytes: some Collection<UInt8>) throws {
        self = try JSONDecoder().decode(JSONValue.self, from: Data(bytes))
    }

    /// The value as JSON text (members sorted).
    public var description: String {
        switch self {
        case .null: "null"
        case .bool(let value): "\(value)"
        case .integer(let value): "\(value)"
        case .number(let value): "\(value)"
        case .string(let value): "\"\(value)\""
        case .array(let values): "[\(values.map(\.description).joined(separator: ","))]"
        case .object(let members): "{\(members.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ","))}"
        }
    }

    /// JSON Schema's name for the value's type (an integer is a number too).
    fileprivate func isOfType(_ name: String) -> Bool {
        switch (self, name) {
        case (.null, "null"), (.bool, "boolean"), (.integer, "integer"), (.integer, "number"), (.number, "number"),
             (.string, "string"), (.array, "array"), (.object, "object"):
            true
        default:
            false
        }
    }
}

/// Checks values against one of the project's JSON Schemas (`docs/*.schema.json`).
///
/// It knows the keywords those schemas use — `type`, `const`, `enum`, `required`,
/// `properties`, `additionalProperties`, `minimum` and `format: uuid` — and treats any other
/// keyword as a problem, so a schema that grows a keyword this check does not know fails loudly
/// instead of passing everything. `scripts/check-schemas` checks the schemas themselves with a
/// full validator.
public struct JSONSchemaCheck: Sendable {
    private let schema: JSONValue

    /// A schema from the repository's `docs` directory, e.g. `outcome.schema.json`.
    public init(docs name: String) throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        schema = try JSONValue(parsing: Data(contentsOf: root.appendingPathComponent("docs").appendingPathComponent(name)))
    }

    /// What is wrong with `value`, one line each; empty when it matches.
    public func problems(_ value: JSONValue) -> [String] {
        Self.problems(value, schema, at: "$")
    }

    private static let annotations: Set<String> = ["$schema", "$id", "title", "description"]

    private static func problems(_ value: JSONValue, _ schema: JSONValue, at path: String) -> [String] {
        guard case .object(let keywords) = schema else { return ["\(path): the schema is not an object"] }
        var found: [String] = []
        for (keyword, argument) in keywords.sorted(by: { $0.key < $1.key }) where !annotations.contains(keyword) {
            switch (keyword, argument) {
            case ("type", .string(let name)):
                if !value.isOfType(name) { found.append("\(path): \(value) is not of type \(name)") }
            case ("type", .array(let names)):
                if !names.contains(where: { if case .string(let name) = $0 { value.isOfType(name) } else { false } }) {
                    found.append("\(path): \(value) is none of the types \(names)")
                }
            case ("const", let expected):
                if value != expected { found.append("\(path): \(value) is not \(expected)") }
            case ("enum", .array(let allowed)):
                if !allowed.contains(value) { found.append("\(path): \(value) is not one of \(allowed)") }
            case ("minimum", .integer(let minimum)):
                if case .integer(let number) = value, number < minimum { found.append("\(path): \(number) < \(minimum)") }
                if case .number(let number) = value, number < Double(minimum) { found.append("\(path): \(number) < \(minimum)") }
            case ("format", .string("uuid")):
                if case .string(let text) = value, UUID(uuidString: text) == nil { found.append("\(path): \"\(text)\" is not a UUID") }
            case ("required", .array(let names)):
                guard case .object(let members) = value else { continue }
                for case .string(let name) in names where members[name] == nil { found.append("\(path): no \"\(name)\"") }
            case ("properties", .object(let properties)):
                guard case .object(let members) = value else { continue }
                for (name, member) in members.sorted(by: { $0.key < $1.key }) {
                    if let property = properties[name] { found += problems(member, property, at: "\(path).\(name)") }
                }
            case ("additionalProperties", let allowed):
                guard case .object(let members) = value else { continue }
                guard case .object(let properties) = keywords["properties"] ?? .object([:]) else { continue }
                for (name, member) in members.sorted(by: { $0.key < $1.key }) where properties[name] == nil {
                    switch allowed {
                    case .bool(false): found.append("\(path): \"\(name)\" is not allowed")
                    case .bool(true): break
                    default: found += problems(member, allowed, at: "\(path).\(name)")
                    }
                }
            default:
                found.append("\(path): this check does not know the schema keyword \(keyword): \(argument)")
            }
        }
        return found
    }
}
