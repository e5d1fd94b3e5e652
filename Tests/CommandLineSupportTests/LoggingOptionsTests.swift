import ArgumentParser
@testable import CommandLineSupport
import Foundation
import Logging
import Testing

@Suite("--log-level and --log-format, their variables, and the JSON lines", .timeLimit(.minutes(1)))
struct LoggingOptionsTests {
    static func resolve(_ arguments: [String], _ environment: [String: String], default level: LogLevel = .info) throws -> (LogLevel, LogFormat) {
        try LoggingOptions.parse(arguments).resolved(defaultLevel: level, environment: environment)
    }

    @Test func aFlagWinsOverItsVariableWhichWinsOverTheDefault() throws {
        #expect(try Self.resolve([], [:]) == (.info, .text))
        #expect(try Self.resolve([], [:], default: .error) == (.error, .text))
        #expect(try Self.resolve([], ["APNS_RELAY_LOG_LEVEL": "debug", "APNS_RELAY_LOG_FORMAT": "json"]) == (.debug, .json))
        #expect(try Self.resolve([], ["APNS_RELAY_LOG_LEVEL": "WARNING"]) == (.warning, .text))
        #expect(try Self.resolve(["--log-level", "trace", "--log-format", "json"],
                                 ["APNS_RELAY_LOG_LEVEL": "critical", "APNS_RELAY_LOG_FORMAT": "text"]) == (.trace, .json))
        // An empty variable is unset.
        #expect(try Self.resolve([], ["APNS_RELAY_LOG_LEVEL": ""], default: .notice) == (.notice, .text))
    }

    @Test func aVariableNamingNoLevelOrFormatIsAnError() throws {
        #expect {
            try Self.resolve([], ["APNS_RELAY_LOG_LEVEL": "loud"])
        } throws: { error in
            "\(error)".contains("APNS_RELAY_LOG_LEVEL=loud is not one of trace, debug, info, notice, warning, error, critical")
        }
        #expect {
            try Self.resolve([], ["APNS_RELAY_LOG_FORMAT": "yaml"])
        } throws: { error in
            "\(error)" == "APNS_RELAY_LOG_FORMAT=yaml is not one of text, json"
        }
        // The flag given, the variable it overrides is not read.
        #expect(try Self.resolve(["--log-format", "text"], ["APNS_RELAY_LOG_FORMAT": "yaml"]) == (.info, .text))
        #expect(throws: (any Error).self) { try LoggingOptions.parse(["--log-level", "loud"]) }
    }

    @Test func aJSONLineHoldsTimeLevelMessageSourceAndMetadata() throws {
        struct Refused: Error, CustomStringConvertible { var description: String { "refused \"x\"" } }
        let event = LogEvent(level: .warning, message: "outcome \"not\" published\nyet", metadata: nil, source: "Relay",
                             file: #fileID, function: #function, line: #line)
        var withError = event
        withError.error = Refused()
        let metadata: Logger.Metadata = [
            "intent.id": "i-1", "kafka.partition": .stringConvertible(3), "level": "shadowed",
            "nested": .dictionary(["b": "2", "a": .array(["x", "y"])]),
        ]
        let time = timespec(tv_sec: 1_795_442_709, tv_nsec: 42_999_999)
        let bytes = JSONLogHandler.line(withError, label: "apns-relay", metadata: metadata, now: time)
        #expect(bytes.last == UInt8(ascii: "\n"))
        #expect(bytes.dropLast().contains(UInt8(ascii: "\n")) == false)
        let text = String(decoding: bytes.dropLast(), as: UTF8.self)
        #expect(text == #"{"time":"2026-11-23T14:05:09.042Z","level":"warning","message":"outcome \"not\" published\nyet","source":"Relay","label":"apns-relay","error":"refused \"x\"","intent.id":"i-1","kafka.partition":"3","metadata.level":"shadowed","nested":{"a":["x","y"],"b":"2"}}"#)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
        #expect(object["message"] as? String == "outcome \"not\" published\nyet")
        #expect(object["kafka.partition"] as? String == "3")
    }

    @Test func theHandlerMergesItsOwnTheProvidersAndTheCallsMetadata() throws {
        let pipe = try #require(Self.pipe())
        defer { close(pipe.read) }
        var handler = JSONLogHandler(label: "test", level: .info, output: LogOutput(descriptor: pipe.write))
        handler[metadataKey: "relay.worker"] = "w1"
        handler[metadataKey: "kafka.partition"] = "1"
        handler.metadataProvider = Logger.MetadataProvider { ["trace.id": "t"] }
        var logger = Logger(label: "test") { _ in handler }
        logger.logLevel = .info
        logger.debug("not written")
        logger.info("written", metadata: ["kafka.partition": "2"])
        close(pipe.write)
        let text = String(decoding: Self.readAll(pipe.read), as: UTF8.self)
        let lines = text.split(separator: "\n")
        try #require(lines.count == 1, "\(text)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(object["message"] as? String == "written")
        #expect(object["relay.worker"] as? String == "w1")
        #expect(object["trace.id"] as? String == "t")
        #expect(object["kafka.partition"] as? String == "2")
        #expect(object["level"] as? String == "info")
        #expect((object["time"] as? String)?.hasSuffix("Z") == true)
    }

    static func pipe() -> (read: Int32, write: Int32)? {
        var ends: [Int32] = [0, 0]
        return Foundation.pipe(&ends) == 0 ? (ends[0], ends[1]) : nil
    }

    static func readAll(_ descriptor: Int32) -> [UInt8] {
        var bytes: [UInt8] = [], chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else { return bytes }
            bytes += chunk[..<count]
        }
    }
}
