/* admission.c: the claim's share of a GPU, and the rate limiter that holds launches to it. */
#ifndef DRAGPU_ADMISSION_H
#define DRAGPU_ADMISSION_H

#include "common.h"

extern bool dl_throttle_on; /* set once by init: cores < 100 */
void dl_throttle_configure(int cores);
/* The wall time a launch of gpu_ns of GPU time on the region device dev costs the claim at its share. */
int64_t dl_wall_cost(int dev, int64_t gpu_ns);
/* What admission asks of the launches being measured (measure.c, the caller, passes its own). */
struct dl_measured {
    void (*poll)(void);                            /* applies the measurements that have completed */
    int64_t (*queued_ahead)(int dev, int64_t now); /* how far past now this process's queued work runs */
    int64_t (*stalled)(int64_t now);               /* how long an overdue measurement has been pending, or 0 */
};
/* Waits until the claim's clock for dev is within its burst of now, then advances it by what gpu_ns of GPU time
 * costs at the claim's share now (arbiter.c). */
void dl_admit(int dev, int64_t gpu_ns, int64_t now, const struct dl_measured *m);
void dl_sleep_ns(int64_t ns);

#endif
