/*
 * Admission: launches are admitted so that the claim's kernels occupy the GPU for its share of wall time.
 *
 *   - Admission is GCRA (the virtual-scheduling form of a token bucket) on one clock per device kept in
 *     the claim's region: `tat` is the wall time at which the claim will have paid for all GPU time
 *     admitted so far. A launch of cost c advances tat by c * 100 / cores; it may proceed while tat is at
 *     most BURST_NS ahead of now, otherwise the launching thread sleeps until it is (in slices of at most
 *     SLICE_NS, applying the measurements that arrived meanwhile). When a measurement arrives, tat moves
 *     by the difference between measured and charged cost (either sign), so every nanosecond of GPU time
 *     is eventually paid for exactly once.
 *   - In steady state the admitted GPU time therefore tracks cores% of wall time to within the burst
 *     and the measurements still in flight, independently of kernel sizes, launch rates and process
 *     counts - unlike a grid-count bucket tuned by sampled utilisation (the peers' approach).
 *
 * A kernel longer than the burst is paid as debt: its measured time moves the clock far ahead of wall time,
 * and the claim's next launches wait until it is paid, so the share holds on average.
 *
 * The unthrottled path (cores unset or 100) is one predictable branch: no lock, no system call.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "admission.h"
#include "arbiter.h"
#include "clock.h"
#include "common.h"
#include "log.h"
#include "region.h"

#define BURST_NS 4000000LL        /* how far ahead of wall time admitted work may run */
#define SLICE_NS 2000000LL        /* longest sleep between two looks at completed measurements */
#define BORROW_QUEUE_NS 2000000LL /* how much work a borrowing process may have queued on the device */

bool dl_throttle_on;
static double wall_per_gpu_ns = 1.0; /* 100 / cores: a multiplication on every launch, not a division */

void dl_throttle_configure(int pct) { /* 1..100 (config.c) */
    wall_per_gpu_ns = 100.0 / pct;
    dl_throttle_on = pct < 100;
    if (dl_throttle_on) dl_debug("compute share %d%%", pct);
}

#define HELD_SLICE_NS 200000LL
#define STALL_WAIT_MAX_NS                                                                                              \
    1000000000LL /* past this, a stalled measurement no longer holds launches back */ /* between two looks at whether a claim held to nothing may run */

int64_t dl_wall_cost(int dev, int64_t gpu_ns) {
    return (int64_t)((double)gpu_ns * dl_arbiter_last_wall_per_gpu(dev, wall_per_gpu_ns));
}

void dl_sleep_ns(int64_t ns) {
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

/* GCRA admission on the claim's shared clock for this device. */
/* Sleeps a slice of a wait for admission, counted as the claim's (and, held by a latency claim, as held). */
static void wait_slice(int dev, int64_t ns, int64_t now, int held, const struct dl_measured *m) {
    dl_arbiter_waiting(dev, 1, now);
    dl_sleep_ns(ns);
    int64_t slept = (int64_t)dl_now_ns() - now;
    dl_arbiter_waiting(dev, -1, now);
    dl_arbiter_slept(dev, slept, held);
    dl_region_add_throttled(dev, slept);
    m->poll();
}

void dl_admit(int dev, int64_t gpu_ns, int64_t now, const struct dl_measured *m) {
    _Atomic int64_t *tat = dl_region_tat(dev);
    for (int first = 1;; first = 0) {
        if (!first) now = (int64_t)dl_now_ns();
        struct dl_share sh;
        dl_arbiter_share(dev, now, wall_per_gpu_ns, BURST_NS, &sh);
        if (DL_UNLIKELY(sh.wall_per_gpu < 0)) { /* held to nothing: it waits, wanting the GPU, until it may run */
            wait_slice(dev, HELD_SLICE_NS, now, sh.held, m);
            continue;
        }
        /* A borrowed share may reach the whole GPU, where the clock alone would let this process queue far more
         * than the device runs (the gaps between kernels are not charged): while it borrows, its queue is held to
         * BORROW_QUEUE_NS (at most the burst), so that a claim waking up waits for no deep queue of a borrower's. */
        int64_t queued = sh.borrowing ? m->queued_ahead(dev, now) : 0;
        int64_t deep = sh.burst_ns < BORROW_QUEUE_NS ? sh.burst_ns : BORROW_QUEUE_NS;
        if (DL_UNLIKELY(queued > deep)) {
            int64_t wait = queued - deep;
            wait_slice(dev, wait < SLICE_NS ? wait : SLICE_NS, now, sh.held, m);
            continue;
        }
        /* The device runs far behind the charges (a measurement long overdue): wait for it, a second at most. */
        int64_t stalled = m->stalled(now);
        if (DL_UNLIKELY(stalled) && stalled < STALL_WAIT_MAX_NS) {
            wait_slice(dev, SLICE_NS / 4, now, sh.held, m);
            continue;
        }
        int64_t wall = (int64_t)((double)gpu_ns * sh.wall_per_gpu);
        int64_t t = atomic_load(tat);
        int64_t base = t > now ? t : now;
        if (base - now > sh.burst_ns) {
            if (DL_UNLIKELY(base - now > DL_TAT_MAX_AHEAD_NS)) { /* never wait forever on a rewritten clock */
                dl_region_tat_reset(dev, t, now);
                continue;
            }
            int64_t wait = base - now - sh.burst_ns;
            wait_slice(dev, wait < SLICE_NS ? wait : SLICE_NS, now, sh.held, m);
            continue;
        }
        if (atomic_compare_exchange_weak(tat, &t, base + wall)) {
            dl_arbiter_admitted(dev, base + wall, now);
            return;
        }
    }
}
