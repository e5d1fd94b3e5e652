#include "allocator_settings.h"

// jemalloc (linked on Linux, Package.swift) reads `malloc_conf` from the executable when it
// starts, before `main`; the MALLOC_CONF environment variable is read after it, so an
// operator's setting wins, option by option.
//
// narenas:2 — jemalloc's default is four arenas per CPU in the process's affinity mask: on a
// Kubernetes node usually all of the node's, since a CPU limit does not narrow the mask (256
// arenas on a 64-core node). Each thread allocates from one arena, and each arena keeps the
// pages its frees leave, so the relay's threads (event loops, librdkafka's, the Redis
// client's, Swift's executor) spread the same bytes over more arenas as the node grows. On a
// 2-core machine two arenas measured a median of 5% less peak RSS than the default eight in
// `apns-relay-dev bench e2e`; CPU per intent moved within the runs' spread, and jemalloc's
// time per intent in a profile not at all (docs/performance.md, "jemalloc in two arenas").
// The threads' caches take most allocations without the arena's lock, so two arenas serve
// more cores than two.
#if defined(__linux__)
const char *malloc_conf = "narenas:2";
#endif
