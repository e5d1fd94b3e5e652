public import ArgumentParser
import Common
import Foundation
public import Logging

/// How much a command logs: `trace` … `critical`.
public enum LogLevel: String, CaseIterable, ExpressibleByArgument, Sendable {
    case trace, debug, info, notice, warning, error, critical

    /// Any case: `INFO` is `info`.
    public init?(argument: String) {
        self.init(rawValue: argument.lowercased())
    }

    public var level: Logger.Level {
        switch self {
        case .trace: .trace
        case .debug: .debug
        case .info: .info
        case .notice: .notice
        case .warning: .warning
        case .error: .error
        case .critical: .critical
        }
    }
}

/// How log lines look: `text` (swift-log's stream format, for a terminal) or `json` (one object per
/// line, for a log pipeline).
public enum LogFormat: String, CaseIterable, ExpressibleByArgument, Sendable {
    case text, json

    public init?(argument: String) {
        self.init(rawValue: argument.lowercased())
    }
}

/// `--log-level` and `--log-format`, on every command. A flag wins over its environment variable
/// (`APNS_RELAY_LOG_LEVEL`, `APNS_RELAY_LOG_FORMAT`), which wins over the command's default: `run`
/// and `simulate` log at info, the commands whose output is the point (`send`, `jwt`, `inspect`,
/// `check-config`, `bench`…) at error. Logs go to standard error.
public struct LoggingOptions: ParsableArguments, Sendable {
    @Option(help: ArgumentHelp("The least severe level logged. Default: $APNS_RELAY_LOG_LEVEL, else the command's own (info for run, error for commands that print a result).",
                               valueName: "level"))
    public var logLevel: LogLevel?

    @Option(help: ArgumentHelp("text, or json: one object per line with time, level, message, source and metadata. Default: $APNS_RELAY_LOG_FORMAT, else text.",
                               valueName: "format"))
    public var logFormat: LogFormat?

    public init() {}

    public static let levelVariable = "APNS_RELAY_LOG_LEVEL"
    public static let formatVariable = "APNS_RELAY_LOG_FORMAT"

    /// The level and format in effect: the flag, else the environment variable, else the default.
    /// An environment variable naming no level or format is an error (a typo must not log
    /// silently at another level).
    public func resolved(defaultLevel: LogLevel, environment: [String: String]) throws(ValidationError) -> (LogLevel, LogFormat) {
        func fromEnvironment<Value: ExpressibleByArgument & CaseIterable & RawRepresentable<String>>(
            _ name: String, _: Value.Type) throws(ValidationError) -> Value? {
            guard let text = environment[name], !text.isEmpty else { return nil }
            guard let value = Value(argument: text) else {
                throw ValidationError("\(name)=\(text) is not one of \(Value.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            return value
        }
        var level = logLevel, format = logFormat
        if level == nil { level = try fromEnvironment(Self.levelVariable, LogLevel.self) }
        if format == nil { format = try fromEnvironment(Self.formatVariable, LogFormat.self) }
        return (level ?? defaultLevel, format ?? .text)
    }

    /// Sets up swift-log for this process (once: a command calls it first thing in `run`).
    /// Returns the format in effect.
    @discardableResult
    public func bootstrap(defaultLevel: LogLevel) throws(ValidationError) -> LogFormat {
        let (level, format) = try resolved(defaultLevel: defaultLevel, environment: ProcessInfo.processInfo.environment)
        defer { Terminal.logFormat.withLock { $0 = format } }
        LoggingSystem.bootstrap { label in
            switch format {
            case .text:
                var handler = StreamLogHandler.standardError(label: label)
                handler.logLevel = level.level
                return handler
            case .json:
                return JSONLogHandler(label: label, level: level.level, output: .standardError)
            }
        }
        return format
    }
}

/// One JSON object per line: `time` (UTC, RFC 3339 with milliseconds), `level`, `message`,
/// `source` (the module), `label` (the logger's), `error` when one was logged, then each metadata
/// key as it is (`intent.id`, `kafka.partition`, `kafka.offset`, `apns.topic`…). A metadata key
/// equal to one of the fixed keys is written as `metadata.<key>`.
public struct JSONLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var logLevel: Logger.Level
    private let label: String
    private let output: LogOutput

    public init(label: String, level: Logger.Level, output: LogOutput) {
        self.label = label
        self.logLevel = level
        self.output = output
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        output.write(Self.line(event, label: label, metadata: merged(event.metadata)))
    }

    private func merged(_ call: Logger.Metadata?) -> Logger.Metadata {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { $1 } }
        if let call { all.merge(call) { $1 } }
        return all
    }

    private static let fixedKeys: Set<String> = ["time", "level", "message", "source", "label", "error"]

    /// The event as one JSON line (newline included). Metadata keys are sorted: lines compare.
    static func line(_ event: LogEvent, label: String, metadata: Logger.Metadata,
                     now: timespec = LogClock.now()) -> [UInt8] {
        var writer = JSONObjectWriter(capacity: 256)
        writer.add("time", LogClock.rfc3339(now))
        writer.add("level", event.level.rawValue)
        writer.add("message", event.message.description)
        writer.add("source", event.source)
        writer.add("label", label)
        if let error = event.error { writer.add("error", "\(error)") }
        for key in metadata.keys.sorted() {
            writer.addJSON(key: fixedKeys.contains(key) ? "metadata.\(key)" : key, json(metadata[key]!))
        }
        var bytes = writer.finish()
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }

    private static func json(_ value: Logger.Metadata.Value) -> [UInt8] {
        switch value {
        case .string(let text): return Array(JSONObjectWriter.quote(text).utf8)
        case .stringConvertible(let convertible): return Array(JSONObjectWriter.quote(convertible.description).utf8)
        case .array(let values):
            var bytes: [UInt8] = [UInt8(ascii: "[")]
            for (index, element) in values.enumerated() {
                if index > 0 { bytes.append(UInt8(ascii: ",")) }
                bytes += json(element)
            }
            bytes.append(UInt8(ascii: "]"))
            return bytes
        case .dictionary(let dictionary):
            var writer = JSONObjectWriter()
            for key in dictionary.keys.sorted() { writer.addJSON(key: key, json(dictionary[key]!)) }
            return writer.finish()
        }
    }
}

/// Where log lines go: whole lines, one writer at a time, so lines from several threads never
/// interleave.
public final class LogOutput: Sendable {
    private let descriptor: Int32
    private let lock = Locked(())

    public static let standardError = LogOutput(descriptor: 2)

    public init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    func write(_ bytes: [UInt8]) {
        lock.withLock { _ in
            bytes.withUnsafeBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    let written = Foundation.write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                    if written > 0 {
                        offset += written
                    } else if written < 0 && errno == EINTR {
                        continue
                    } else {
                        return  // stderr closed or full beyond repair: the line is dropped
                    }
                }
            }
        }
    }
}

/// The wall clock as log lines show it.
enum LogClock {
    static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    /// `2026-11-23T14:05:09.042Z`.
    static func rfc3339(_ time: timespec) -> String {
        var seconds = time_t(time.tv_sec)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func padded(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return padded(parts.tm_year + 1900, 4) + "-" + padded(parts.tm_mon + 1, 2) + "-" + padded(parts.tm_mday, 2)
            + "T" + padded(parts.tm_hour, 2) + ":" + padded(parts.tm_min, 2) + ":" + padded(parts.tm_sec, 2)
            + "." + padded(Int32(time.tv_nsec / 1_000_000), 3) + "Z"
    }
}
