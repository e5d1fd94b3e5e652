import ArgumentParser

@main
struct APNsRelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apns-relay",
        abstract: "Delivers Apple push notifications over HTTP/2.",
        subcommands: [RunCommand.self, CheckConfigCommand.self, DemoCommand.self, SendCommand.self, SimulateCommand.self, BenchCommand.self, JWTCommand.self, InspectCommand.self])
}
