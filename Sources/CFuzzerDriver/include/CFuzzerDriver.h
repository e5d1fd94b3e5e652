#ifndef C_FUZZER_DRIVER_H
#define C_FUZZER_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver (libclang_rt.fuzzer, linked by -sanitize=fuzzer): parses libFuzzer's
/// flags from argv and runs `callback` on every input.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
