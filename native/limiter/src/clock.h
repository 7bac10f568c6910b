/* clock.c: the library's clock. */
#ifndef DRAGPU_CLOCK_H
#define DRAGPU_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t dl_now_ns(void);

#endif
