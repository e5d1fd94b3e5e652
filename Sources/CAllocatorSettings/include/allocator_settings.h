#ifndef APNS_RELAY_ALLOCATOR_SETTINGS_H
#define APNS_RELAY_ALLOCATOR_SETTINGS_H

/// The options the executables give jemalloc, which reads them when it starts, before `main`.
extern const char *malloc_conf;

#endif
