import Common
import Logging
import NIOCore
import NIOSSL

/// Finds the master of a Redis Sentinel deployment (``RedisConfiguration/Mode/sentinel``): asks
/// the Sentinels, one after another, `SENTINEL GET-MASTER-ADDR-BY-NAME <name>`, starting with
/// the one that answered last, and takes the first address one gives (as Redis' guidelines for
/// Sentinel clients say). Asked at every connect of the client's connections: a connection to a
/// master that failed, or that a failover made a replica (``RedisSlot`` closes it on
/// `READONLY`, and checks `ROLE` at connect), is made again to the master the Sentinels name then.
final class RedisSentinelResolver: Sendable {
    /// One connection per Sentinel.
    private let sentinels: [RedisSlot]
    private let addresses: [RedisNodeAddress]
    let masterName: String
    /// The Sentinel that answered last (asked first next time), and the master it named.
    private let last = Locked<(sentinel: Int, master: RedisNodeAddress?)>((0, nil))

    init(configuration: RedisConfiguration, loops: [any EventLoop], sslContext: NIOSSLContext?, logger: Logger) {
        addresses = [RedisNodeAddress(host: configuration.url.host, port: configuration.url.port)] + configuration.sentinels
        masterName = configuration.sentinelMaster
        sentinels = addresses.enumerated().map { index, address in
            var settings = configuration
            settings.mode = .standalone
            // A Sentinel has no databases and its own password (if any).
            settings.url = RedisURL(host: address.host, port: address.port, database: 0, username: nil,
                                    password: configuration.sentinelPassword, tls: configuration.url.tls)
            return RedisSlot(eventLoop: loops[index % loops.count], configuration: settings, sslContext: sslContext, logger: logger)
        }
    }

    /// The master the Sentinels name last, if one did yet.
    var master: RedisNodeAddress? { last.withLock { $0.master } }

    /// The master's address, from the first Sentinel that names it; fails with every Sentinel's
    /// answer when none does by `deadline`.
    func masterAddress(deadline: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<RedisNodeAddress> {
        let first = last.withLock { $0.sentinel }
        let order = (0..<sentinels.count).map { (first + $0) % sentinels.count }
        return ask(order, at: 0, failures: [], deadline: deadline, on: loop)
    }

    /// Asks the Sentinel `order[position]`, then the next ones while none names the master.
    private func ask(_ order: [Int], at position: Int, failures: [String], deadline: NIODeadline,
                     on loop: any EventLoop) -> EventLoopFuture<RedisNodeAddress> {
        let command = RedisCommandBuffer([RedisCommand("SENTINEL", ["GET-MASTER-ADDR-BY-NAME", masterName])])
        guard position < order.count else {
            return loop.makeFailedFuture(RedisError.unavailable("no Sentinel names master \(masterName): \(failures.joined(separator: "; "))"))
        }
        let index = order[position]
        return sentinels[index].execute(command, deadline: deadline).hop(to: loop).flatMapThrowing { replies -> RedisNodeAddress in
            guard case .array(let values)? = replies.first else {
                throw RedisError.unavailable("\(self.addresses[index]) answered \(replies.first.map { "\($0)" } ?? "nothing")")
            }
            guard values.count == 2, let host = values[0].string, let port = values[1].string.flatMap({ Int($0) }),
                  (1...65535).contains(port) else {
                throw RedisError.unavailable("\(self.addresses[index]) does not know master \(self.masterName)")
            }
            let master = RedisNodeAddress(host: host, port: port)
            self.last.withLock { $0 = (index, master) }
            return master
        }.flatMapError { error in
            self.ask(order, at: position + 1, failures: failures + ["\(self.addresses[index]): \(error)"], deadline: deadline, on: loop)
        }
    }

    func shutdown() async {
        for sentinel in sentinels { try? await sentinel.shutdown().get() }
    }
}
