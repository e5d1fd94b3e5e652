#ifndef APNS_RELAY_ALLOCATOR_SETTINGS_H
#define APNS_RELAY_ALLOCATOR_SETTINGS_H

/// The options the executables give jemalloc, which reads them when it starts, before `main`
/// (Linux only: elsewhere the executables keep the system's allocator).
#if defined(__linux__)
extern const char *malloc_conf;
#endif

#endif
