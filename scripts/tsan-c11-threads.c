// C11 threads over POSIX threads, preloaded by `scripts/test --sanitize=thread` only.
//
// Debian's librdkafka uses glibc's C11 threads (`thrd_create`, `mtx_lock`, `cnd_wait`...), which
// glibc implements by calling its pthread internals directly, past the thread sanitizer's
// interceptors. The sanitizer then never learns of librdkafka's threads (the first allocation
// on one, the mock cluster's, crashed the run inside the sanitizer's allocator) nor of its locks.
// Defined here over the public pthread functions, which the sanitizer intercepts, both are seen.
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

static int result(int error) {
    switch (error) {
    case 0: return thrd_success;
    case EBUSY: return thrd_busy;
    case ETIMEDOUT: return thrd_timedout;
    case ENOMEM: case EAGAIN: return thrd_nomem;
    default: return thrd_error;
    }
}

struct start { thrd_start_t body; void *argument; };

static void *run(void *context) {
    struct start start = *(struct start *)context;
    free(context);
    return (void *)(intptr_t)start.body(start.argument);
}

int thrd_create(thrd_t *thread, thrd_start_t body, void *argument) {
    struct start *start = malloc(sizeof *start);
    if (start == NULL) return thrd_nomem;
    start->body = body;
    start->argument = argument;
    int error = pthread_create((pthread_t *)thread, NULL, run, start);
    if (error != 0) free(start);
    return result(error);
}

int thrd_join(thrd_t thread, int *answer) {
    void *returned = NULL;
    int error = pthread_join((pthread_t)thread, &returned);
    if (error == 0 && answer != NULL) *answer = (int)(intptr_t)returned;
    return result(error);
}

int thrd_detach(thrd_t thread) { return result(pthread_detach((pthread_t)thread)); }

int mtx_init(mtx_t *mutex, int type) {
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
    if (type & mtx_recursive) pthread_mutexattr_settype(&attributes, PTHREAD_MUTEX_RECURSIVE);
    int error = pthread_mutex_init((pthread_mutex_t *)mutex, &attributes);
    pthread_mutexattr_destroy(&attributes);
    return result(error);
}

int mtx_lock(mtx_t *mutex) { return result(pthread_mutex_lock((pthread_mutex_t *)mutex)); }
int mtx_trylock(mtx_t *mutex) { return result(pthread_mutex_trylock((pthread_mutex_t *)mutex)); }
int mtx_timedlock(mtx_t *restrict mutex, const struct timespec *restrict until) {
    return result(pthread_mutex_timedlock((pthread_mutex_t *)mutex, until));
}
int mtx_unlock(mtx_t *mutex) { return result(pthread_mutex_unlock((pthread_mutex_t *)mutex)); }
void mtx_destroy(mtx_t *mutex) { pthread_mutex_destroy((pthread_mutex_t *)mutex); }

int cnd_init(cnd_t *condition) { return result(pthread_cond_init((pthread_cond_t *)condition, NULL)); }
int cnd_signal(cnd_t *condition) { return result(pthread_cond_signal((pthread_cond_t *)condition)); }
int cnd_broadcast(cnd_t *condition) { return result(pthread_cond_broadcast((pthread_cond_t *)condition)); }
int cnd_wait(cnd_t *condition, mtx_t *mutex) {
    return result(pthread_cond_wait((pthread_cond_t *)condition, (pthread_mutex_t *)mutex));
}
int cnd_timedwait(cnd_t *restrict condition, mtx_t *restrict mutex, const struct timespec *restrict until) {
    return result(pthread_cond_timedwait((pthread_cond_t *)condition, (pthread_mutex_t *)mutex, until));
}
void cnd_destroy(cnd_t *condition) { pthread_cond_destroy((pthread_cond_t *)condition); }

void call_once(once_flag *flag, void (*body)(void)) { pthread_once((pthread_once_t *)flag, body); }
