/*
 * What the fake offers tests besides the driver API (exported, but no driver entry points): how often each
 * entry point was called (fakecuda_calls; every entry point counts itself with COUNT()), a device's memory in
 * use (fakecuda_used_bytes) and the kernel time it has run (fakecuda_busy_ns), uses of events whose context
 * is gone (fakecuda_stale_event_uses), and the fake's own definition of an exact symbol (fakecuda_symbol, for
 * benchmarks that bypass any interposer).
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <string.h>

#include "fake_proctable.h"

/* ---------------------------------------------------------------- call counters */

#define MAX_COUNTERS 256
static struct {
    const char *name;
    _Atomic unsigned long n;
} counters[MAX_COUNTERS];
static int n_counters;
static pthread_mutex_t counters_mu = PTHREAD_MUTEX_INITIALIZER;

_Atomic unsigned long *fake_counter(const char *name) {
    pthread_mutex_lock(&counters_mu);
    int i;
    for (i = 0; i < n_counters; i++) {
        if (strcmp(counters[i].name, name) == 0) break;
    }
    if (i == n_counters && n_counters < MAX_COUNTERS) counters[n_counters++].name = name;
    pthread_mutex_unlock(&counters_mu);
    return &counters[i < MAX_COUNTERS ? i : MAX_COUNTERS - 1].n;
}

/* fork(): driver.c takes the device lock first, then this one (a holder of it waits for nothing). */
void fake_counters_lock(void) { pthread_mutex_lock(&counters_mu); }
void fake_counters_unlock(void) { pthread_mutex_unlock(&counters_mu); }

EXPORT unsigned long fakecuda_calls(const char *name) {
    pthread_mutex_lock(&counters_mu);
    unsigned long n = 0;
    for (int i = 0; i < n_counters; i++) {
        if (strcmp(counters[i].name, name) == 0) n = counters[i].n;
    }
    pthread_mutex_unlock(&counters_mu);
    return n;
}

EXPORT uint64_t fakecuda_used_bytes(int device) {
    fake_configure();
    if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
    pthread_mutex_lock(&mu);
    settle_descriptors();
    uint64_t u = devices[device].used;
    pthread_mutex_unlock(&mu);
    return u;
}

/* Device time spent executing kernels so far (queued work that has not run yet is not counted). */
EXPORT uint64_t fakecuda_busy_ns(int device) {
    fake_configure();
    if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
    pthread_mutex_lock(&mu);
    uint64_t now = now_ns(), b = devices[device].busy_total;
    if (devices[device].busy_until > now) /* kernel time still to run: what is after now of each queued kernel */
        for (int i = 0; i < QUEUE_DEPTH; i++) {
            uint64_t st = devices[device].queue_start[i], en = devices[device].queue_end[i];
            if (en > now) b -= en - (st > now ? st : now);
        }
    pthread_mutex_unlock(&mu);
    return b;
}

/* Uses of an event whose context was destroyed since it was made (the driver's answer:
 * CUDA_ERROR_CONTEXT_IS_DESTROYED; on a real driver, undefined). */
EXPORT unsigned long fakecuda_stale_event_uses(void) { return stale_event_uses; }

/* The fake's own definition of an exact symbol (for benchmarks that bypass any interposer). */
EXPORT void *fakecuda_symbol(const char *name) {
    for (unsigned i = 0; i < fake_proc_table_len; i++) {
        if (strcmp(fake_proc_table[i].symbol, name) == 0) return (void *)fake_proc_table[i].fn;
    }
    return NULL;
}
