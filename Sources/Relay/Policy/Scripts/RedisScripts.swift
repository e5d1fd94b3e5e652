/// The Lua scripts the relay runs in Redis live next to this file as `.lua` files, compiled into
/// the module (`PackageResources`, SwiftPM's `embedInCode`): nothing to ship beside the binary.
enum RedisScripts {
    /// One script's source from its parts, in order.
    static func source(_ parts: [UInt8]...) -> String {
        String(decoding: parts.joined(), as: UTF8.self)
    }
}
