import APNsSimulator
import Common
import NIOCore
import NIOPosix
import NIOSSL

/// A misbehaving peer on loopback: optionally TLS (with the given ALPN protocols), it writes
/// `greeting` once connected and ignores everything it receives.
final class ScriptedServer: Sendable {
    private let channel: any Channel
    let port: Int
    /// Opens when a client's first bytes arrive (over TLS: once the handshake is done).
    let heardFromAClient: AsyncLatch

    private final class Mute: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let greeting: [UInt8]
        let heard: AsyncLatch
        init(greeting: [UInt8], heard: AsyncLatch) {
            self.greeting = greeting
            self.heard = heard
        }
        func channelActive(context: ChannelHandlerContext) {
            if !greeting.isEmpty {
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: greeting)), promise: nil)
            }
            context.fireChannelActive()
        }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { heard.open() }
    }

    /// An empty SETTINGS frame: enough for a client to think HTTP/2 is up.
    static let settingsFrame: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]

    static func start(tlsProtocols: [String]?, greeting: [UInt8]) async throws -> ScriptedServer {
        var sslContext: NIOSSLContext?
        if let tlsProtocols {
            let identity = try APNsSimulator.makeSelfSignedIdentity()  // server identity
            var tls = TLSConfiguration.makeServerConfiguration(
                certificateChain: identity.chain.map { .certificate($0) }, privateKey: .privateKey(identity.key))
            tls.applicationProtocols = tlsProtocols
            sslContext = try NIOSSLContext(configuration: tls)
        }
        let context = sslContext
        let heard = AsyncLatch()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let context {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    }
                    try channel.pipeline.syncOperations.addHandler(Mute(greeting: greeting, heard: heard))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return ScriptedServer(channel: channel, port: channel.localAddress!.port!, heard: heard)
    }

    private init(channel: any Channel, port: Int, heard: AsyncLatch) {
        self.channel = channel
        self.port = port
        heardFromAClient = heard
    }

    func stop() async {
        try? await channel.close()
    }
}
