import ArgumentParser
import BuildInfo

/// `apns-relay`: what production runs. The development tools (`demo`, `simulate`, `bench`) are a
/// second executable, `apns-relay-dev`, so that this one links no simulator, mock Kafka cluster
/// or redis-server launcher.
@main
struct APNsRelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-relay",
        abstract: "Delivers Apple push notifications over HTTP/2.",
        discussion: "Demo, simulator and benchmarks: apns-relay-dev.",
        version: "apns-relay \(BuildInfo.description)",
        subcommands: [RunCommand.self, CheckConfigCommand.self, SendCommand.self, JWTCommand.self, InspectCommand.self,
                      InvalidationsCommand.self, ChannelsCommand.self, RedriveCommand.self])
}
