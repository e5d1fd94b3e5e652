public import Foundation

/// Where tests write their files (keys, configurations, records): one directory per test
/// process, removed when the process exits, so that runs leave nothing behind in /tmp.
public enum TestFiles {
    public static let directory: URL = {
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("apns-relay-tests-\(ProcessInfo.processInfo.processIdentifier)")
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(at: TestFiles.directory) }
        return directory
    }()

    /// A path in ``directory``.
    public static func path(_ name: String) -> URL {
        directory.appendingPathComponent(name)
    }
}
