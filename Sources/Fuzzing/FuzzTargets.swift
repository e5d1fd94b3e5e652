import APNs
import APNsSimulator
import Foundation
import HTTP2
import Kafka
import Logging
import NIOCore
import NIOEmbedded
import Redis
import Relay
import Tracing

/// The entry points the fuzzer drives, one per place the relay reads bytes it does not control.
///
/// Each target takes arbitrary bytes, must return (no crash, no hang, no unbounded memory), and
/// checks what it can about the answer: an outcome is valid JSON, a payload that passes
/// validation is a JSON object within APNs' size limit for its push type.
/// `scripts/fuzz TARGET SECONDS` runs one under libFuzzer and the address sanitizer; the tests
/// replay every seed and every input that once failed (`Fuzz/corpus`, `Fuzz/regressions`)
/// through the same functions.
public enum FuzzTarget: String, CaseIterable, Sendable {
    /// A Kafka message value: the JSON reader, intent parsing and payload validation, and the
    /// `invalid` outcome a rejected intent gets.
    case intent
    /// Bytes from a Redis server: hiredis' reply reader and the values made of its replies.
    case resp
    /// Bytes from an APNs server: the HTTP/2 client handler (nghttp2) with three requests in
    /// flight, and the reading of each response as an APNs result.
    case http2Client = "http2-client"
    /// Bytes from an HTTP/2 client (after the connection preface): the simulator's connection.
    case simulator
    /// A configuration file: YAML, the keys the relay knows, their validation.
    case configuration
    /// An intent's `traceparent` and `tracestate` headers (cut apart where the input holds
    /// `\xFF\xFEcut`): their reading, and the headers its outcome carries through the tracer
    /// that exports spans.
    case trace

    /// Runs one input and says how far it got: intents accepted, replies decoded, responses
    /// completed, bytes the simulator answered, configurations accepted. Violations of what the
    /// target checks stop the process (the fuzzer keeps the input).
    @discardableResult
    public func run(_ bytes: UnsafeRawBufferPointer) -> Int {
        switch self {
        case .intent: Self.intent(bytes)
        case .resp: Self.resp(bytes)
        case .http2Client: Self.http2Client(bytes)
        case .simulator: Self.simulator(bytes)
        case .configuration: Self.configuration(bytes)
        case .trace: Self.trace(bytes)
        }
    }

    @discardableResult
    public func run(_ bytes: [UInt8]) -> Int {
        bytes.withUnsafeBytes { run($0) }
    }

    // MARK: - Targets

    private static func intent(_ bytes: UnsafeRawBufferPointer) -> Int {
        let outcome: Outcome
        do {
            let intent = try Intent.parse(Array(bytes), key: nil, now: 1_700_000_000, defaultTTL: 86_400)
            let payload = Array(intent.payload.readableBytesView)
            // APNs' limits, written out rather than taken from the validator they check.
            let limit = intent.pushType == .voip || intent.channelID != nil ? 5120 : 4096
            precondition(payload.count <= limit, "a payload over its push type's limit passed validation")
            precondition(isJSONObject(payload), "a payload that passed validation is not a JSON object")
            precondition(intent.channelID == nil || (intent.token.isEmpty && intent.pushType == .liveactivity),
                         "a channel intent with a token or another push type passed validation")
            var delivered = Outcome(id: intent.id, token: intent.channelID == nil ? intent.token : nil, topic: intent.topic,
                                    status: .delivered, httpStatus: 200, apnsID: Intent.apnsID(for: intent.id).uuidString.lowercased(),
                                    attempts: 1, latencyMilliseconds: 1, lane: "fuzz", partition: 0, offset: 0, worker: "fuzz", at: 0)
            delivered.channelID = intent.channelID
            outcome = delivered
        } catch {
            var invalid = Outcome(id: error.id, token: error.token, topic: error.topic, status: .invalid,
                                  reason: "\(error.reason): \(error.message)", attempts: 0, latencyMilliseconds: 0,
                                  lane: "fuzz", partition: 0, offset: 0, worker: "fuzz", at: 0)
            invalid.channelID = error.channelID
            outcome = invalid
        }
        precondition(isJSONObject(outcome.utf8), "an outcome is not a JSON object: \(outcome.json)")
        return outcome.status == .invalid ? 0 : 1
    }

    private static func resp(_ bytes: UnsafeRawBufferPointer) -> Int {
        let decoder = RESPDecoder()
        var replies = 0
        for chunk in chunks(bytes) {
            do {
                try decoder.feed(ByteBuffer(bytes: chunk))
                while try decoder.next() != nil { replies += 1 }
            } catch {
                break  // a protocol error: the connection would be closed
            }
        }
        return replies
    }

    private static func http2Client(_ bytes: UnsafeRawBufferPointer) -> Int {
        var configuration = HTTP2ClientHandler.Configuration()
        configuration.requireALPN = false
        configuration.maxConcurrentStreams = 2
        configuration.timerResolution = .seconds(5)  // the 70 s the loop is moved on in 14 steps, not 1,400
        let handler = HTTP2ClientHandler(configuration: configuration)
        let channel = EmbeddedChannel(handler: handler)
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        guard (try? channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()) != nil else { return 0 }
        var completed = 0
        let deadline = channel.embeddedEventLoop.now + .seconds(5)
        for index in 0..<3 {
            var headers = HTTP2Headers()
            headers.add("apns-topic", "com.example.app")
            let request = HTTP2Request(authority: "api.push.apple.com", path: "/3/device/\(index)", headers: headers,
                                       body: ByteBuffer(string: #"{"aps":{"alert":"hi"}}"#))
            handler.execute(request, deadline: deadline) { answer in
                if case .success(let response) = answer {
                    _ = APNsClient.result(from: response, apnsID: "00000000-0000-0000-0000-000000000000", attempts: 1)
                    completed += 1
                }
            }
        }
        feed(chunks(bytes), to: channel)
        channel.embeddedEventLoop.advanceTime(by: .seconds(70))  // deadlines, the ping and its timeout
        feed([], to: channel)
        return completed
    }

    private static func simulator(_ bytes: UnsafeRawBufferPointer) -> Int {
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        guard let handler = try? APNsSimulator.connectionHandler(SimulatorConfiguration(), on: channel.eventLoop),
              (try? channel.pipeline.syncOperations.addHandler(handler)) != nil,
              (try? channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 50_000)).wait()) != nil else { return 0 }
        var answered = clientPreface.withUnsafeBytes { feed([$0] + chunks(bytes), to: channel) }
        channel.embeddedEventLoop.advanceTime(by: .seconds(70))
        answered += feed([], to: channel)
        return answered
    }

    private static func configuration(_ bytes: UnsafeRawBufferPointer) -> Int {
        (try? RelayConfiguration.load(yaml: String(decoding: bytes, as: UTF8.self))) == nil ? 0 : 1
    }

    /// swift-otel's tracer, as the relay makes it, its service running (it takes the ended
    /// spans; their export to a closed port fails quietly); none in a build without the
    /// `OTLPExport` trait (sanitizer builds), where the outcome carries the intent's headers.
    private static let tracer: (any Tracer)? = {
        guard RelayTracing.isBuiltIn else { return nil }
        var logger = Logger(label: "fuzz")
        logger.logLevel = .critical
        do {
            let tracing = try RelayTracing(endpoint: "http://127.0.0.1:9", protocol: .httpProtobuf, logger: logger, environment: [:])
            let service = tracing.service
            Task.detached { try? await service.run() }
            return tracing.tracer
        } catch {
            fatalError("the tracer cannot be made: \(error)")
        }
    }()

    private static func trace(_ bytes: UnsafeRawBufferPointer) -> Int {
        let parts = chunks(bytes)
        var headers = [KafkaHeader(name: "traceparent", value: parts.first.map { Array($0) } ?? [])]
        if parts.count > 1 { headers.append(KafkaHeader(name: "tracestate", value: Array(parts[1]))) }
        let message = KafkaMessage(topic: "apns.intents", partition: 0, offset: 0, key: nil, value: [], timestamp: nil,
                                   headers: headers)
        let outgoing = RelayPipeline.outcomeTraceHeaders(message, tracer: tracer)
        guard let parent = outgoing.first(where: { $0.name == "traceparent" }) else {
            precondition(outgoing.isEmpty, "trace headers without a traceparent: \(outgoing)")
            return 0
        }
        // The outcome stays in the intent's trace, with headers W3C allows.
        let value = parent.value ?? [], incoming = headers[0].value ?? []
        precondition(value.count == 55 && value.prefix(36) == incoming.prefix(36), "the outcome's traceparent left the intent's trace")
        for header in outgoing {
            precondition(header.value?.allSatisfy { (0x20...0x7E).contains($0) } == true, "a trace header that is not printable ASCII")
        }
        return 1
    }

    // MARK: - Helpers

    private static let clientPreface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    /// Writes each chunk as one read, until the channel closes; returns how many bytes the
    /// handler wrote back (drained, so that they do not pile up).
    @discardableResult
    private static func feed(_ chunks: [UnsafeRawBufferPointer], to channel: EmbeddedChannel) -> Int {
        var written = 0
        func drain() {
            while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { written += buffer.readableBytes }
        }
        for chunk in chunks where channel.isActive {
            do {
                try channel.writeInbound(ByteBuffer(bytes: chunk))
            } catch {
                break
            }
            drain()
        }
        drain()
        return written
    }

    /// The input cut where it holds the five bytes `\xFF\xFEcut`, so that the fuzzer can try
    /// replies that arrive in pieces; without them, the whole input as one read.
    private static func chunks(_ bytes: UnsafeRawBufferPointer) -> [UnsafeRawBufferPointer] {
        let marker: [UInt8] = [0xFF, 0xFE, 0x63, 0x75, 0x74]
        var pieces: [UnsafeRawBufferPointer] = []
        var start = 0
        var index = 0
        while index + marker.count <= bytes.count {
            if bytes[index] == marker[0], zip(bytes[index..<(index + marker.count)], marker).allSatisfy({ $0 == $1 }) {
                pieces.append(UnsafeRawBufferPointer(rebasing: bytes[start..<index]))
                index += marker.count
                start = index
            } else {
                index += 1
            }
        }
        pieces.append(UnsafeRawBufferPointer(rebasing: bytes[start...]))
        return pieces
    }

    private static func isJSONObject(_ bytes: [UInt8]) -> Bool {
        (try? JSONSerialization.jsonObject(with: Data(bytes))) is [String: Any]
    }
}
