/* How long the calling thread waited for a CPU: the compute-accuracy tests discount it from their lower
 * bound (on a loaded machine nobody launches while the launcher waits, which is not the cap's doing). */
#ifndef LIMITER_TEST_SCHEDSTAT_H
#define LIMITER_TEST_SCHEDSTAT_H

#include <stdint.h>
#include <stdio.h>

/* Time runnable but not running (the second field of /proc/thread-self/schedstat), ns; 0 where the kernel
 * does not keep it. */
static inline uint64_t run_delay_ns(void) {
    unsigned long long run = 0, wait = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return 0;
    int n = fscanf(f, "%llu %llu", &run, &wait);
    fclose(f);
    return n == 2 ? wait : 0;
}

#endif
