/*
 * Lazy initialisation. The library has no constructor: it is preloaded into every process of a
 * container (shells and tools included) and must cost nothing there. The first intercepted call that
 * needs the configuration reads the environment once and opens the claim's region; later calls see
 * dl_core_ready with one acquire load.
 *
 * fork(): the child inherits the parent's region lock and counters, which are not its own. The atfork
 * child handler drops them; the child initialises again on its next limited call.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "limiter.h"

extern char **environ;

struct dl_config dl_cfg;
_Atomic int dl_core_ready;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int atfork_registered;

static void before_fork(void) {
    pthread_mutex_lock(&init_mu);
    dl_driver_before_fork();
}
static void after_fork_parent(void) {
    dl_driver_after_fork(0);
    pthread_mutex_unlock(&init_mu);
}
static void after_fork_child(void) {
    dl_driver_after_fork(1);
    pthread_mutex_init(&init_mu, NULL);
    if (atomic_load(&dl_core_ready)) {
        dl_region_reset_after_fork();
        dl_memory_reset_after_fork();
        dl_throttle_reset_after_fork();
        atomic_store(&dl_core_ready, 0);
    }
}

void dl_core_init_slow(void) {
    pthread_mutex_lock(&init_mu);
    if (!atomic_load_explicit(&dl_core_ready, memory_order_relaxed)) {
        dl_config_load(&dl_cfg, environ);
        dl_log_level = dl_cfg.log_level;
        dl_region_open(dl_cfg.state_dir[0] ? dl_cfg.state_dir : NULL);
        dl_throttle_configure(dl_cfg.cores);
        if (!atfork_registered) {
            pthread_atfork(before_fork, after_fork_parent, after_fork_child);
            atfork_registered = 1;
        }
        dl_debug("initialised: %s region, cores %d%%", dl_region_is_shared() ? "shared" : "private",
                 dl_cfg.cores);
        atomic_store_explicit(&dl_core_ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&init_mu);
}

void dl_uuid_format(const unsigned char b[16], char out[DL_UUID_LEN]) {
    snprintf(out, DL_UUID_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

uint64_t dl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
