/* arbiter.c: elastic compute - a claim's share of a GPU from the node agent's board and the claims' activity. */
#ifndef DRAGPU_ARBITER_H
#define DRAGPU_ARBITER_H

#include "common.h"

/* Tells the arbiter the GPU UUID of a region device (devices.c, once per process and ordinal). */
void dl_arbiter_bind(int dev, const char *uuid);
/* What admission on dev applies now. */
struct dl_share {
    double wall_per_gpu; /* the wall time one ns of GPU time costs: 100 / the share; negative: may not run now */
    int held;            /* a latency claim is what holds the claim back (held_ns) */
    int elastic;         /* the device takes part in arbitration */
    int borrowing;       /* the share is above the claim's floor: time others may want back */
    int64_t burst_ns;    /* how far ahead of wall time admitted work may run */
};
/* fixed and burst: the share and burst of a device that takes no part (no board, or outside a claim). No system
 * call: one load of the board's sequence number and one of each other claim's demand_until_ns; the share is
 * worked out again only when which claims are active changes (a changed board maps its files again). */
void dl_arbiter_share(int dev, int64_t now, double fixed, int64_t burst, struct dl_share *out);
/* The last answer of dl_arbiter_wall_per_gpu for dev (fixed when it takes no part, or may not run): what a
 * measurement's difference from its charge is settled at. */
double dl_arbiter_last_wall_per_gpu(int dev, double fixed);
/* A launch was admitted at now and the claim's clock reaches until (ns): the claim wants the GPU until then (no
 * further ahead than the others count). */
void dl_arbiter_admitted(int dev, int64_t until, int64_t now);
/* A launch waits for admission (waiting +1 at start, -1 at its end; slept ns, held: by a latency claim). */
void dl_arbiter_waiting(int dev, int delta, int64_t now);
void dl_arbiter_slept(int dev, int64_t ns, int held);
/* GPU time charged to the claim for a launch on dev (the final figure: measured, or the estimate). */
void dl_arbiter_charged(int dev, int64_t ns);

#endif
