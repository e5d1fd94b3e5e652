import Foundation
import PackagePlugin

/// Writes the `BuildInfo` target's `GeneratedBuildInfo.swift` before every build: the version from
/// the package's `VERSION` file and the git commit (`scripts/build-info`; no network). The file is
/// rewritten only when its text changes, so an unchanged tree rebuilds nothing.
@main
struct BuildInfoPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "Generated")
        let package = context.package.directoryURL
        // An image build has no .git: it names the commit in APNS_RELAY_COMMIT instead.
        let commit = ProcessInfo.processInfo.environment["APNS_RELAY_COMMIT"] ?? ""
        return [
            .prebuildCommand(
                displayName: "Build information from VERSION and git",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: [package.appending(path: "scripts/build-info").path, package.path, output.path],
                environment: ["APNS_RELAY_COMMIT": commit, "PATH": "/usr/local/bin:/usr/bin:/bin"],
                outputFilesDirectory: output),
        ]
    }
}
