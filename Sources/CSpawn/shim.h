#pragma once
#include <spawn.h>

// glibc declares these only for _GNU_SOURCE / _DEFAULT_SOURCE builds, which Swift's Glibc
// module is not.
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
extern int pipe2(int pipefd[2], int flags);
