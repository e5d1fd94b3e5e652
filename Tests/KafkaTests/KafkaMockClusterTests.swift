import Foundation
import KafkaTesting
import Spawn
import Synchronization
import TestSupport
import Testing

/// The mock cluster as the outage tests drive it, next to what the rest of a test process does.
@Suite struct KafkaMockClusterTests {
    /// librdkafka's mock broker, taken down, closes its listener and binds its port again at
    /// once, and aborts the process if that bind fails. It fails while a child process started
    /// at that moment still holds a copy of the listener (between its `clone` and the `exec`
    /// that closes it): the port is still listened on. Tests start redis-servers and other
    /// children while others take brokers down, so the two must not meet.
    @Test func aBrokerGoesDownAndUpWhileChildrenStart() async throws {
        let cluster = try KafkaMockCluster(brokers: 1)
        let stop = Atomic<Bool>(false)
        let started = Atomic<Int>(0)
        let finished = DispatchSemaphore(value: 0)
        let spawner = Thread {
            while !stop.load(ordering: .relaxed) {
                guard let child = try? ChildProcess(executable: "/bin/true", arguments: []) else { continue }
                _ = child.wait()
                started.add(1, ordering: .relaxed)
            }
            finished.signal()
        }
        spawner.start()
        for _ in 0..<1_000 {
            await cluster.setBroker(1, up: false)
            await cluster.setBroker(1, up: true)
        }
        stop.store(true, ordering: .relaxed)
        await onOwnThread { finished.wait() }
        #expect(started.load(ordering: .relaxed) > 0)
    }
}
