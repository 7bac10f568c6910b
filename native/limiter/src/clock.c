/* The library's clock: every module that times something reads it here (CLOCK_MONOTONIC). */
#define _GNU_SOURCE
#include <time.h>

#include "clock.h"

uint64_t dl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
