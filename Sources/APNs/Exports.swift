// APNs' model, for every user of the client: `import APNs` is enough.
@_exported import APNsCore
