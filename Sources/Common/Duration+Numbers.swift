extension Duration {
    /// The whole duration in nanoseconds.
    public var totalNanoseconds: Int64 {
        components.seconds &* 1_000_000_000 &+ components.attoseconds / 1_000_000_000
    }

    /// The whole duration in milliseconds (truncated).
    public var totalMilliseconds: Int64 { totalNanoseconds / 1_000_000 }

    /// The whole duration in seconds.
    public var totalSeconds: Double { Double(totalNanoseconds) / 1e9 }
}
