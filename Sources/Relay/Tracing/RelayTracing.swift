import BuildInfo
import Common
import Foundation
import Kafka
public import Logging
#if OTLPExport
import OTel
#endif
public import ServiceLifecycle
public import Tracing
import W3CTraceContext

/// An OTLP/HTTP collector's address, `http(s)://HOST:PORT[/PREFIX]`; spans go to
/// `PREFIX/v1/traces` (``url``).
struct OTLPEndpoint: Sendable, Equatable {
    var host: String
    var port: Int
    var tls: Bool
    /// Where spans are posted: the address with `/v1/traces` appended.
    var url: String

    init?(_ text: String) {
        guard let parsed = URL(string: text), let scheme = parsed.scheme, ["http", "https"].contains(scheme),
              let host = parsed.host, !host.isEmpty, parsed.query == nil, parsed.fragment == nil else { return nil }
        self.host = host
        self.tls = scheme == "https"
        self.port = parsed.port ?? (tls ? 443 : 4318)
        self.url = (text.hasSuffix("/") ? String(text.dropLast()) : text) + "/v1/traces"
    }
}

/// How spans are encoded on their way to the collector: OTLP/HTTP's binary protobuf, its
/// default and what every collector takes.
///
/// `http/json` is not offered: swift-otel writes OTLP/JSON with swift-protobuf's JSON mapping,
/// which puts `traceId`, `spanId` and `parentSpanId` in base64, where OTLP/JSON requires hex. A
/// collector rejects those spans or links them wrongly (``jsonRefusal``).
public enum OTLPProtocol: String, Sendable, CaseIterable {
    /// `application/x-protobuf`, OTLP's default.
    case httpProtobuf = "http/protobuf"

    /// Why `http/json` is refused, as `check-config` says it.
    public static let jsonRefusal = "http/json is not offered: the exporter writes trace and span ids in base64 where OTLP/JSON requires hex, so a collector would reject or mislink the spans; use http/protobuf"
}

/// The tracer the relay's spans start from and the service that exports them: swift-otel's
/// tracer, batch processor and OTLP/HTTP exporter, set up for a relay that continues traces and
/// never starts one (parent-based sampling, W3C trace context only).
///
/// Bounded as swift-otel's batch processor is: at most 8,192 spans wait (more are dropped), a
/// batch of at most 512 goes out every second, and an export (a shutdown's flush included) has
/// 5 s. The standard `OTEL_*` environment variables (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_RESOURCE_ATTRIBUTES`...) override these settings, except
/// those that would change what the relay promises or that swift-otel cannot honour here
/// (``environmentProblems(_:)``): those are refused.
public struct RelayTracing: Sendable {
    public let tracer: any Tracer
    /// Runs the export; stops after the pipeline, so the last outcomes' spans go out.
    public let service: any Service

    /// `environment`: the process's when nil (swift-otel reads the process's all the same).
    public init(endpoint: String, protocol encoding: OTLPProtocol, logger: Logger,
                environment: [String: String]? = nil) throws {
        guard let endpoint = OTLPEndpoint(endpoint) else {
            throw RelayTracingError.badEndpoint(endpoint)
        }
        if let problem = Self.environmentProblems(environment ?? ProcessInfo.processInfo.environment).first {
            throw RelayTracingError.environment(problem)
        }
        #if OTLPExport
        var configuration = OTel.Configuration.default
        configuration.serviceName = "apns-relay"
        configuration.resourceAttributes = ["service.version": BuildInfo.version]
        configuration.diagnosticLogger = .custom(logger)
        configuration.propagators = [.traceContext]
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.traces.sampler = .parentBasedAlwaysOn
        configuration.traces.batchSpanProcessor.scheduleDelay = .seconds(1)
        configuration.traces.batchSpanProcessor.maxQueueSize = 8192
        configuration.traces.batchSpanProcessor.maxExportBatchSize = 512
        configuration.traces.batchSpanProcessor.exportTimeout = .seconds(5)
        configuration.traces.otlpExporter.endpoint = endpoint.url
        configuration.traces.otlpExporter.timeout = .seconds(5)
        configuration.traces.otlpExporter.protocol = switch encoding {
        case .httpProtobuf: .httpProtobuf
        }
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        tracer = backend.factory
        service = backend.service
        #else
        throw RelayTracingError.notBuiltIn
        #endif
    }

    /// Whether this build exports spans (the package's `OTLPExport` trait, on by default).
    public static var isBuiltIn: Bool {
        #if OTLPExport
        true
        #else
        false
        #endif
    }
}

extension RelayTracing {
    /// `OTEL_*` variables swift-otel would apply that the relay cannot take, each with why:
    /// another propagator (the outcome carries W3C trace context; swift-otel stops the process
    /// on `baggage`), a sampler that is not parent-based (the relay continues traces, it never
    /// starts one), another exporter or the SDK off (spans were asked for), gRPC (not built in).
    /// Checked by `check-config`, `run` and a reload when `tracing.otlp_endpoint` is set.
    public static func environmentProblems(_ environment: [String: String]) -> [String] {
        func value(_ name: String) -> String? {
            environment[name].map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.flatMap { $0.isEmpty ? nil : $0 }
        }
        var problems: [String] = []
        if let propagators = value("OTEL_PROPAGATORS"), propagators != "tracecontext" {
            problems.append("OTEL_PROPAGATORS=\(propagators): the relay carries W3C trace context only; leave it unset or set tracecontext")
        }
        if let sampler = value("OTEL_TRACES_SAMPLER"), !sampler.hasPrefix("parentbased_") {
            problems.append("OTEL_TRACES_SAMPLER=\(sampler): the relay continues traces and never starts one; leave it unset or use a parentbased_ sampler")
        }
        if let exporter = value("OTEL_TRACES_EXPORTER"), exporter != "otlp" {
            problems.append("OTEL_TRACES_EXPORTER=\(exporter): tracing.otlp_endpoint asks for OTLP; leave it unset or set otlp")
        }
        if let disabled = value("OTEL_SDK_DISABLED"), disabled != "false" {
            problems.append("OTEL_SDK_DISABLED=\(disabled): tracing.otlp_endpoint asks for spans; empty it to turn them off")
        }
        for name in ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] {
            if let encoding = value(name), OTLPProtocol(rawValue: encoding) == nil {
                problems.append("\(name)=\(encoding): " + (encoding == "http/json" ? OTLPProtocol.jsonRefusal : "only http/protobuf is built in"))
            }
        }
        return problems
    }
}

enum RelayTracingError: Error, CustomStringConvertible {
    case badEndpoint(String)
    case environment(String)
    /// Built without the `OTLPExport` trait (sanitizer builds).
    case notBuiltIn

    var description: String {
        switch self {
        case .badEndpoint(let text): "tracing.otlp_endpoint \(URLCredentials.redacted(text)) is not http(s)://HOST:PORT[/PREFIX]"
        case .environment(let problem): problem
        case .notBuiltIn: "tracing.otlp_endpoint is set, but this build exports no spans (built without the OTLPExport trait)"
        }
    }
}

/// A wall-clock instant for spans started and ended after the fact.
struct WallInstant: TracerInstant {
    var nanosecondsSinceEpoch: UInt64

    init(_ nanoseconds: UInt64) {
        nanosecondsSinceEpoch = nanoseconds
    }

    static func < (lhs: Self, rhs: Self) -> Bool { lhs.nanosecondsSinceEpoch < rhs.nanosecondsSinceEpoch }
}

/// Reads an intent's trace context, already checked (``RelayPipeline/traceContext(_:)``), as a
/// propagator asks for it: the tracer never parses a header as it came from Kafka.
struct TraceContextExtractor: Extractor {
    func extract(key: String, from carrier: TraceContext) -> String? {
        switch key {
        case "traceparent": carrier.traceParentHeaderValue
        case "tracestate": carrier.traceStateHeaderValue.flatMap { $0.isEmpty ? nil : $0 }
        default: nil
        }
    }
}

/// Writes a propagator's headers onto an outcome's Kafka message.
struct KafkaHeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [KafkaHeader]) {
        carrier.append(KafkaHeader(name: key, value: Array(value.utf8)))
    }
}
