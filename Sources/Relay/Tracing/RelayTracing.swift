import BuildInfo
import Foundation
import Kafka
public import Logging
import OTel
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

/// How spans are encoded on their way to the collector.
public enum OTLPProtocol: String, Sendable, CaseIterable {
    /// `application/x-protobuf`, OTLP's default.
    case httpProtobuf = "http/protobuf"
    /// `application/json` (ids in base64, as swift-protobuf writes bytes).
    case httpJSON = "http/json"
}

/// The tracer the relay's spans start from and the service that exports them: swift-otel's
/// tracer, batch processor and OTLP/HTTP exporter, set up for a relay that continues traces and
/// never starts one (parent-based sampling, W3C trace context only).
///
/// Bounded as swift-otel's batch processor is: at most 8,192 spans wait (more are dropped), a
/// batch of at most 512 goes out every second, and an export (a shutdown's flush included) has
/// 5 s. The standard `OTEL_*` environment variables (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_RESOURCE_ATTRIBUTES`...) override these settings.
public struct RelayTracing: Sendable {
    public let tracer: any Tracer
    /// Runs the export; stops after the pipeline, so the last outcomes' spans go out.
    public let service: any Service

    public init(endpoint: String, protocol encoding: OTLPProtocol, logger: Logger) throws {
        guard let endpoint = OTLPEndpoint(endpoint) else {
            throw RelayTracingError.badEndpoint(endpoint)
        }
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
        case .httpJSON: .httpJSON
        }
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        tracer = backend.factory
        service = backend.service
    }
}

enum RelayTracingError: Error, CustomStringConvertible {
    case badEndpoint(String)

    var description: String {
        switch self {
        case .badEndpoint(let text): "tracing.otlp_endpoint \(text) is not http(s)://HOST:PORT[/PREFIX]"
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
