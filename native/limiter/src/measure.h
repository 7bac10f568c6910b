/* measure.c: the GPU time of throttled launches, and each launch's bookkeeping around the driver call. */
#ifndef DRAGPU_MEASURE_H
#define DRAGPU_MEASURE_H

#include "common.h"

/* One throttled launch, from before the driver call to after it. */
struct dl_ticket {
    int dev;
    int measure;      /* timed by events */
    int first;        /* the first launch of its kind, being measured (probe) */
    int stands_for;   /* the launches its measurement settles: SAMPLE_EVERY when drawn at random, else 1 */
    int64_t recorded; /* measured: the host time its start event was recorded */
    int64_t backlog;  /* and whether the device had not reached its start event when it was recorded */
    int64_t synced;   /* not: the wall time at admission, for timing by synchronising the stream */
    int64_t charged_ns;
    int64_t queued_sum; /* the device's queued_sum (measure.c) once this launch was added to it */
    uint64_t key;
    CUcontext ctx;
    CUevent start, end;
};

/* The kind of a launch: its function (or graph) and grid size. */
static inline uint64_t dl_launch_key(const void *fn, uint64_t blocks) {
    return dl_hash64((uint64_t)(uintptr_t)fn ^ (blocks * 0x9e3779b97f4a7c15ull));
}
/* Before the driver call: finds the launch's device, charges its estimate, waits for admission, records its
 * start event when it is timed. After it: records the end event (or refunds a failed launch). */
void dl_ticket_open(struct dl_ticket *t, uint64_t key, CUstream stream, int ptsz);
void dl_ticket_close(struct dl_ticket *t, CUresult r, CUstream stream, int ptsz);
/* How far past now the work this process has queued on dev is expected to run (negative: none queued). */
int64_t dl_measure_queued_ahead(int dev, int64_t now);
/* How long the oldest launch still being measured has been pending, when that is past any kernel's reason (20 ms):
 * the device runs far behind what was charged; 0 otherwise. */
int64_t dl_measure_stalled(int64_t now);
/* Applies the measurements that have completed, unless that could disturb an open capture. */
void dl_measure_poll(void);
/* Before a context goes: the timing events kept for it are destroyed while it exists (NULL: every
 * context's). */
void dl_throttle_forget_context(CUcontext ctx);

#endif
