// The relay's model and pure state machines, for every user of the relay: `import Relay` is enough.
@_exported import RelayCore
