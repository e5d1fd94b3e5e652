import CFuzzerDriver
import Foundation
import Fuzzing

/// libFuzzer's entry points for one fuzz target, named by `APNS_RELAY_FUZZ_TARGET` (see
/// `FuzzTarget`; `scripts/fuzz` sets it). Built only by `scripts/fuzz`, with `-sanitize=fuzzer`.
private let target: FuzzTarget = {
    let name = ProcessInfo.processInfo.environment["APNS_RELAY_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        fatalError("APNS_RELAY_FUZZ_TARGET must be one of \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")), not \"\(name)\"")
    }
    return target
}()

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    target.run(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

/// SwiftPM links an executable with `main` defined as `<module>_main`, which can hide
/// libFuzzer's own `main`: this is that function, and it does what libFuzzer's does.
@_cdecl("FuzzTarget_main")
func fuzzTargetMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, fuzzOneInput)
}
