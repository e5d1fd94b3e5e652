import ArgumentParser
import BuildInfo

/// `apns-relay-dev`: the relay's development tools, apart from the production executable: the
/// demo on embedded defaults, the APNs simulator, the benchmarks and the soak.
@main
struct APNsRelayDevCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-relay-dev",
        abstract: "apns-relay's demo, APNs simulator, benchmarks and soak.",
        version: "apns-relay-dev \(BuildInfo.description)",
        subcommands: [DemoCommand.self, SimulateCommand.self, BenchCommand.self, SoakCommand.self])
}
