/// Checks notification payloads on every send without building a Foundation object tree: one
/// pass of ``JSONReader`` that checks the payload is well-formed JSON whose top level is an
/// object, and reports what sits under `aps`: whether it is an object, its keys, and the value
/// of `content-available` when it is an integer; for MDM pushes, the top level's other members.
enum PayloadScanner {
    static let maximumDepth = JSONReader.maximumDepth

    struct Summary: Equatable {
        enum APS: Equatable { case missing, object, notAnObject }
        var aps: APS = .missing
        /// Keys of `aps` other than `content-available`, in order (the first 16).
        var otherAPSKeys: [String] = []
        var contentAvailable: Int?
        /// With `mdm`: whether the top level has a string `mdm`, and how many members it has.
        var mdmIsString = false
        var topLevelMembers = 0
    }

    enum Failure: Error, Equatable {
        case malformed(offset: Int)
        case invalidUTF8(offset: Int)
        case numberOutOfRange(offset: Int)
        case notAnObject
        case tooDeep
    }

    /// - Parameters:
    ///   - collectAPSKeys: fill ``Summary/otherAPSKeys`` (costs an allocation; only background
    ///     pushes need it).
    ///   - mdm: fill ``Summary/mdmIsString`` and ``Summary/topLevelMembers`` (MDM pushes).
    static func scan(_ bytes: UnsafeRawBufferPointer, collectAPSKeys: Bool = false, mdm: Bool = false) throws(Failure) -> Summary {
        let summary: Summary?
        do {
            summary = try summarize(bytes, collectAPSKeys: collectAPSKeys, mdm: mdm)
        } catch {
            switch error {
            case .malformed(let offset): throw .malformed(offset: offset)
            case .invalidUTF8(let offset): throw .invalidUTF8(offset: offset)
            case .numberOutOfRange(let offset): throw .numberOutOfRange(offset: offset)
            case .tooDeep: throw .tooDeep
            }
        }
        guard let summary else { throw .notAnObject }
        return summary
    }

    /// nil for well-formed JSON that is not an object.
    private static func summarize(_ bytes: UnsafeRawBufferPointer, collectAPSKeys: Bool, mdm: Bool) throws(JSONReader.Failure) -> Summary? {
        var reader = JSONReader(bytes)
        guard reader.nextIs(UInt8(ascii: "{")) else {
            // Tell a well-formed non-object from garbage.
            try JSONReader.validate(bytes)
            return nil
        }
        var summary = Summary()
        try reader.forEachMember { reader, key throws(JSONReader.Failure) in
            if mdm {
                summary.topLevelMembers += 1
                if key == "mdm" {
                    summary.mdmIsString = reader.nextIs(UInt8(ascii: "\""))
                    try reader.skipValue(depth: 1)
                    return
                }
            }
            guard key == "aps" else {
                try reader.skipValue(depth: 1)
                return
            }
            guard reader.nextIs(UInt8(ascii: "{")) else {
                summary.aps = .notAnObject
                try reader.skipValue(depth: 1)
                return
            }
            summary.aps = .object
            summary.otherAPSKeys = []
            summary.contentAvailable = nil
            try reader.forEachMember { reader, key throws(JSONReader.Failure) in
                let value = try reader.readValue(depth: 2)
                if key == "content-available" {
                    if case .integer(let number) = value { summary.contentAvailable = Int(number) }
                } else if collectAPSKeys, summary.otherAPSKeys.count < 16 {
                    summary.otherAPSKeys.append(key)
                }
            }
        }
        try reader.expectEnd()
        return summary
    }
}
