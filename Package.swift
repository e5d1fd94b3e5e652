// swift-tools-version:6.1
import PackageDescription

// No unsafe flags: the library products can be depended on by version. The dynamic exclusivity
// checks the release build used to switch off package-wide are off only on the stored state of
// the HTTP/2 and APNs connection classes (`@exclusivity(unchecked)`), which their event loop alone
// touches (docs/architecture.md has the figures).
let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

// The executables allocate with jemalloc (Debian's libjemalloc-dev; linked, its malloc comes
// before the C library's): intents free on other threads than they allocate on, which glibc's
// malloc serves slowly. Measured with `apns-relay-dev bench e2e` (docs/performance.md): 17% less
// relay CPU per intent with the policy off, 16% with it on. The test binaries keep glibc's.
// CAllocatorSettings links it and compiles its options in (`narenas:2`, for a peak RSS that does
// not grow with the node's cores): an executable gets both by depending on that target.

let package = Package(
    name: "apns-relay",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "apns-relay", targets: ["APNsRelayCLI"]),
        .executable(name: "apns-relay-dev", targets: ["APNsRelayDev"]),
        .library(name: "APNs", targets: ["APNs"]),
        .library(name: "APNsSimulator", targets: ["APNsSimulator"]),
        .library(name: "Kafka", targets: ["Kafka"]),
        .library(name: "KafkaTesting", targets: ["KafkaTesting"]),
        .library(name: "RedisTesting", targets: ["RedisTesting"]),
    ],
    traits: [
        .trait(name: "OTLPExport",
               description: "Spans exported over OTLP/HTTP with swift-otel (tracing.otlp_endpoint). On by default; "
                   + "sanitizer builds leave it out (swift-otel does not compile with -sanitize=thread), "
                   + "and such a relay refuses tracing.otlp_endpoint."),
        .default(enabledTraits: ["OTLPExport"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/swift-otel/swift-w3c-trace-context.git", from: "1.0.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        // OTLP/HTTP only: the gRPC exporter's packages add about 76 s more to a first build on
        // two cores, over the 107 s these take (docs/operations.md, "Tracing").
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
        // Benchmarks/ only: time and allocations of the per-intent steps (docs/performance.md).
        .package(url: "https://github.com/ordo-one/benchmark.git", from: "1.38.1", traits: ["MallocInterposer"]),
        // Tests only: property-based checks with shrinking and reproducible seeds.
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
    ],
    targets: [
        // C protocol engines, from Debian's -dev packages.
        .systemLibrary(
            name: "CNghttp2", pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]),
        // No pkgConfig: hiredis.pc adds -D_FILE_OFFSET_BITS=64, a flag SwiftPM refuses with a
        // warning; the shim includes <hiredis/hiredis.h> from the default include path instead.
        .systemLibrary(
            name: "CHiredis",
            providers: [.apt(["libhiredis-dev"])]),
        .systemLibrary(
            name: "CRdKafka", pkgConfig: "rdkafka",
            providers: [.apt(["librdkafka-dev"])]),

        // Small utilities the modules share: backoff with jitter, the retry loop, the bounded async
        // queue, the latch, Duration arithmetic.
        .target(
            name: "Common",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict),
        // What the executables were built from: VERSION and the git commit, written before every
        // build by the plugin (scripts/build-info).
        .target(name: "BuildInfo", swiftSettings: strict, plugins: ["BuildInfoPlugin"]),
        .plugin(name: "BuildInfoPlugin", capability: .buildTool()),
        // HTTP/2 over NIO with nghttp2 as the protocol engine; no C type escapes it.
        .target(
            name: "HTTP2",
            dependencies: [
                "CNghttp2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
            ],
            swiftSettings: strict),
        // Kafka over librdkafka: producer, consumer group member, mock cluster. No C type escapes it.
        .target(
            name: "Kafka",
            dependencies: [
                "CRdKafka", "Common",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        // Redis over NIO with hiredis' RESP writer and reply reader as the protocol engine.
        .target(
            name: "Redis",
            dependencies: [
                "CHiredis",
                "Common",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict),
        // APNs' model, no I/O: notifications and their validation, push types, payload scanning,
        // reasons and results, identifiers. `APNs` re-exports it.
        .target(
            name: "APNsCore",
            dependencies: [
                "Common",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict),
        // The APNs client: JWT, certificates, connections, the pool (and, re-exported, APNsCore).
        .target(
            name: "APNs",
            dependencies: [
                "APNsCore",
                "Common",
                "HTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict),
        // The relay's model and pure state machines, no I/O (no Kafka, Redis, APNs client, event
        // loop or C library): intents, outcomes, invalidations, the delivery state machine, the
        // lane, offset and credential-fault ledgers, dedupe answers and Redis key names.
        // `Relay` re-exports it.
        .target(
            name: "RelayCore",
            dependencies: [
                "APNsCore",
                "Common",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict),
        // The relay: configuration, the pipeline between Kafka and APNs (and, re-exported, RelayCore).
        .target(
            name: "Relay",
            dependencies: [
                "RelayCore",
                "BuildInfo",
                "Common",
                "APNs",
                "Redis",
                "Kafka",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "OTel", package: "swift-otel", condition: .when(traits: ["OTLPExport"])),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            resources: ["mark_waiting", "park", "take", "release", "badge", "provider_token", "budget", "quarantine", "displaced", "hand_over", "backoff",
                        "note_backoff"].map {
                .embedInCode("Policy/Scripts/\($0).lua")
            },
            swiftSettings: strict),
        // An APNs look-alike server for tests, demos and benchmarks.
        .target(
            name: "APNsSimulator",
            dependencies: [
                "APNs",
                "Common",
                "HTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        // What the two executables share: output helpers, credential options.
        .target(
            name: "CommandLineSupport",
            dependencies: [
                "APNs",
                "Common",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict),
        // jemalloc for the executables: linked, with its options (`malloc_conf`).
        .target(name: "CAllocatorSettings", linkerSettings: [.linkedLibrary("jemalloc", .when(platforms: [.linux]))]),
        // apns-relay: what production runs (run, check-config, send, jwt, inspect). It links no
        // development tooling.
        .executableTarget(
            name: "APNsRelayCLI",
            dependencies: [
                "APNs",
                "BuildInfo",
                "CAllocatorSettings",
                "Common",
                "Redis",
                "Relay",
                "CommandLineSupport",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict),

        // Development tooling, apart from the production graph.
        // Child processes with posix_spawn (CSpawn: the closefrom file action and pipe2, which
        // Swift's Glibc module hides).
        .systemLibrary(name: "CSpawn"),
        .target(name: "Spawn", dependencies: ["CSpawn", "Common"], swiftSettings: strict),
        // librdkafka's mock cluster, for tests, the demo and benchmarks.
        .target(name: "KafkaTesting", dependencies: ["CRdKafka", "Common", "Kafka", "Spawn"], swiftSettings: strict),
        // A private redis-server on a free loopback port, for tests, the demo and benchmarks.
        .target(
            name: "RedisTesting",
            dependencies: ["Common", "Spawn", .product(name: "NIOPosix", package: "swift-nio")],
            swiftSettings: strict),
        // apns-relay-dev: the demo, the APNs simulator and the benchmarks.
        .executableTarget(
            name: "APNsRelayDev",
            dependencies: [
                "BuildInfo",
                "CAllocatorSettings",
                "Common",
                "APNs",
                "APNsSimulator",
                "Redis",
                "Relay",
                "Kafka",
                "KafkaTesting",
                "RedisTesting",
                "Spawn",
                "CommandLineSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict),

        // The fuzz targets (`scripts/fuzz`): every reader of bytes the relay does not control.
        .target(
            name: "Fuzzing",
            dependencies: [
                "APNs", "APNsSimulator", "HTTP2", "Kafka", "Redis", "Relay",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: strict),

        .testTarget(
            name: "APNsTests",
            dependencies: [
                "Common", "APNs", "APNsSimulator", "HTTP2", "Spawn", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: strict),
        // Helpers the test targets share.
        .target(
            name: "TestSupport",
            dependencies: ["Spawn", "Common"],
            path: "Tests/TestSupport",
            swiftSettings: strict),
        .testTarget(
            name: "CommandLineSupportTests",
            dependencies: [
                "CommandLineSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "CommonTests",
            dependencies: ["Common", "TestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "SpawnTests",
            dependencies: ["Spawn"],
            swiftSettings: strict),
        .testTarget(
            name: "RedisTests",
            dependencies: ["Redis", "CHiredis", "RedisTesting", "Spawn", "Common", "TestSupport",
                           .product(name: "MetricsTestKit", package: "swift-metrics"),
                           .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOEmbedded", package: "swift-nio"),
                           .product(name: "NIOConcurrencyHelpers", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio")],
            swiftSettings: strict),
        .testTarget(
            name: "KafkaTests",
            dependencies: ["Common", "Kafka", "KafkaTesting", "Spawn", "TestSupport"],
            swiftSettings: strict),
        .testTarget(
            name: "FuzzingTests",
            dependencies: ["Fuzzing"],
            swiftSettings: strict),
        .testTarget(
            name: "RelayTests",
            dependencies: [
                "Common", "Relay", "APNs", "APNsSimulator", "Kafka", "KafkaTesting", "Redis", "RedisTesting", "Spawn", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PropertyBased", package: "swift-property-based"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)

// libFuzzer's driver for the fuzz targets. Declared only for `scripts/fuzz` (which sets
// APNS_RELAY_FUZZ=1 and builds with -sanitize=fuzzer): libFuzzer provides the driver it calls,
// so in any other build it would not link.
if Context.environment["APNS_RELAY_FUZZ"] == "1" {
    package.targets += [
        .target(name: "CFuzzerDriver"),
        .executableTarget(name: "FuzzTarget", dependencies: ["CFuzzerDriver", "Fuzzing"], swiftSettings: strict),
    ]
}

// The micro-benchmarks (`swift package benchmark`, ordo-one/benchmark): built by every build so
// that they keep compiling, timed only when run. Left out of sanitizer builds
// (APNS_RELAY_NO_BENCHMARKS=1, which scripts/test sets for them) and fuzz builds
// (APNS_RELAY_FUZZ=1): the malloc interposer they count allocations with is not for
// instrumented binaries.
if Context.environment["APNS_RELAY_NO_BENCHMARKS"] != "1" && Context.environment["APNS_RELAY_FUZZ"] != "1" {
    package.targets += [
        .executableTarget(
            name: "RelayBenchmarks",
            dependencies: [
                "APNs", "Common", "Kafka", "Redis", "Relay", "RelayCore",
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "Benchmarks/RelayBenchmarks",
            swiftSettings: strict,
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]),
    ]
}
