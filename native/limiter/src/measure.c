/*
 * Measurement: what GPU time each throttled launch occupies, and the launch's bookkeeping around the driver
 * call (dl_ticket_open before it: where it runs, what it is charged, admission; dl_ticket_close after it).
 *
 * Algorithm: a rate limiter over *measured GPU time*, shared by every process of the claim.
 *
 *   - Cost of a launch = the GPU time it occupies. It is measured, not guessed from grid sizes: while
 *     throttling, the limiter brackets each launch with a pair of timing events on the launch's stream
 *     and reads cuEventElapsedTime once the end event has completed (polled without blocking on later
 *     launches). Until a measurement arrives, the launch is charged an estimate: the running average of
 *     earlier measurements of the same function and grid size, else of all launches, else (nothing
 *     measured yet) PRIOR_NS. The prior is not zero: a cold process must not admit a queue-full of
 *     launches free of charge before its first measurement comes back; nor is a kind never measured
 *     admitted more than once before its first measurement (probe()).
 *   - A bracket holds more than the kernel: the device's gap before the kernel, and the host's time in the
 *     launch while the device was idle (kernel_time()); both are taken off the measurement. Which of them
 *     it holds is told by whether the device had reached the start event when the launch returned: if so,
 *     the host's time since then and the idle gap; if not (the device was busy with our earlier work or with
 *     another context's: another process of the claim, a neighbour), only the events' and the queued gap.
 *     When the start was reached is told by a look at it as soon as it is recorded (reached: the device was
 *     idle, it is stamped then) and, when it was not, by its distance from the latest start that was (an
 *     anchor: the two clocks' offset); an end event reached as soon as it is recorded was stamped late, after
 *     the kernel (the thread preempted): its bracket only bounds the kernel.
 *     The rest is the launch's: a kernel's work after its last useful instruction (its blocks' atomics and
 *     fences, their exit) and a graph's gaps between its nodes hold the device as much as the kernels do.
 *
 * Every launch is charged to the device it runs on: the stream's (a stream of another device than the
 * current context's, or a stream used with no current context at all, as a context-less CUkernel can be),
 * and its timing events are made in the stream's context. A launch whose device cannot be told is charged
 * to the claim's first device, and one that cannot be timed is charged its estimate (the prior when nothing
 * was ever measured): where the limiter cannot measure it errs on the side of the limit, with one log line.
 * A launch whose stream may be capturing (cuStreamIsCapturing cannot tell) is charged its estimate on the
 * current context's device, neither timed nor synchronised (capture.c).
 *
 * Why one file of more than 600 lines: the ring of launches being measured, the pools of timing events, the
 * estimates and the first-launch probes are one state under one mutex (mu), changed together by the launch path,
 * the reaper thread and context destruction; split over files, that lock and all it guards would be shared by
 * each of them.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "measure.h"
#include "fork.h"
#include "admission.h"
#include "arbiter.h"
#include "capture.h"
#include "clock.h"
#include "common.h"
#include "devices.h"
#include "driver.h"
#include "log.h"
#include "region.h"

#define PRIOR_NS 200000LL /* charge of a launch when this process has measured none yet */
#define RING 256          /* launches being measured */
#define POOLS 8           /* contexts with spare timing events */
#define POOL_EVENTS 32
#define EST_SLOTS 1024 /* direct-mapped cost estimates */
/* What a bracket of timing events holds besides the kernel, on the real driver (driver 580 on two H200 machines:
 * tests/real-gpu/bracket-facts.cu and its records h200-bracket-facts*.txt). When the device reached the start
 * event before the launch returned (it was idle), the host's time from the start event's record to the launch's
 * return (measured per launch) and then the device's gap before the kernel: 1.93 to 2.23 us (bracket.idle and
 * bracket.full.idle extra_ns). When the start event was still pending (the device busy with our earlier work or
 * another context's), the events' own device time and the gap: 2.82 to 3.14 us (bracket.queued and
 * bracket.full.queued extra_ns). The queued one is set between the two machines' medians: at most a few hundred
 * nanoseconds of a kernel go uncharged on the faster one, and the slower one's kernels are not charged its
 * longer gaps. The idle one is the one-block kernels' median (1931 ns; the fake's H100 1930): a kernel of a few
 * microseconds launched onto an idle device - a launcher bound by the host's launch time - is charged the few
 * hundred nanoseconds of a full grid's longer gap rather than run them uncharged (2100 here was 8 % of a 2 us
 * kernel uncharged: 32 % busy for a 30 % cap). */
#define GAP_IDLE_NS 1930LL
#define GAP_PENDING_NS 2950LL
/* The device's gap before a kernel queued behind another without events between them (timing.queued_50us_kernel_
 * overhead_ns: 2128 ns on an H100): what the queue's estimate (queued_until) adds per launch that is not timed. */
#define GAP_QUEUED_NS 2130LL
#define MIN_CHARGE_NS 1000LL /* a kernel is charged at least this much of its bracket */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct pending {
    CUcontext ctx;
    CUevent start, end;
    uint64_t key;
    int dev;
    int64_t charged_ns;  /* GPU time charged at admission */
    int64_t extra_ns;    /* what the bracket holds besides the kernel: gaps and the host's time */
    int64_t started_ns;  /* when the reaper first saw its start event reached (0: not yet) */
    int64_t accrued_ns;  /* what the reaper charged it while it ran past its charge */
    int64_t recorded_ns; /* when its start event was recorded (host clock) */
    int64_t queued_sum;  /* the device's queued_sum once it was launched */
    int stands_for;      /* the launches of its kind its measurement settles (the ticket's) */
    int end_late;      /* the end event was stamped when recorded, after the kernel: the bracket is the kernel's most */
    int64_t unsure_ns; /* how much more of the bracket may be the host's: the start reached at an unknown time */
    int64_t returned_ns; /* when the launch returned (host clock) */
    int idle_start;      /* its start event was stamped when recorded (recorded_ns): an anchor */
};
static struct pending ring[RING];
static unsigned ring_head, ring_count;

struct pool {
    CUcontext ctx;
    int n;
    CUevent ev[POOL_EVENTS];
    /* The latest start event recorded onto an idle device, so stamped when its record returned (anchor_ns, host
     * clock): what a start event reached at an unknown time is timed against (0: none). */
    CUevent anchor;
    int64_t anchor_ns;
};
#define ANCHOR_AGE_NS 20000000LL /* an anchor older than this is not used: the two clocks may drift apart */
static struct pool pools[POOLS];
/* The thread that polls the ring owns its head (others only append): at most one polls at a time. */
static _Atomic int polling;
static _Atomic int reaping; /* the reaper thread runs (below) */
static _Atomic int exiting, reaper_polling, exit_hook, no_reaper;
/* When the oldest launch still being measured was recorded (0: none): see dl_measure_stalled. */
static _Atomic int64_t oldest_recorded;

/* When the work this process has queued on each device should end (host clock; the sum of the estimates of
 * what was launched, each GAP_PENDING_NS apart): a launch made before then is queued and its bracket holds no
 * host time. A guess that errs long (several streams at once, other processes) only deducts less. */
static _Atomic int64_t queued_until[DL_MAX_DEVICES];
/* What queued_until was ever moved on by (the estimates and gaps of every launch, cumulative): when a measured
 * launch is seen done, the queue can hold no more than what was launched after it, from then on. Without that,
 * an estimate that errs long (kernels of 2 us a GAP_PENDING_NS apart, launched slower than that by the host)
 * builds up a queue that is not there, and a borrower is held back by it. */
static _Atomic int64_t queued_sum[DL_MAX_DEVICES];

static struct {
    uint64_t key;
    int64_t ns;        /* running average of its measurements */
    int64_t spread_ns; /* running average of how far a measurement fell from the average before it */
    uint32_t measured; /* measurements of this key */
    uint32_t untimed;  /* its launches charged the estimate since the last one timed */
} estimates[EST_SLOTS];
/* Which launches are timed. Every launch of a kind (function and grid) until it has been measured SAMPLE_AFTER
 * times, and every launch of a kind whose times spread by more than 1/SPREAD_TIMED_ALL of their average (and by
 * more than the bracket's jitter): their data differ, and an estimate that swings with them undercharges, as
 * admission runs fastest while it is lowest. Otherwise one launch in SAMPLE_EVERY, drawn at random (8: with the
 * real driver's host costs - an event record takes 1.2 us - a throttled launch adds 0.66 us on the fake, 1.22 us
 * at 4; the compute tests' accuracy is the same): a fixed stride would time only one phase of a
 * periodic workload - the same kernel and grid every few launches on different data, as a model's layers
 * repeat - and charge that phase's time to every launch. (t_launch periodic, one 400 us kernel and three of
 * 20 us, with the real driver's gaps: timed on every fourth launch, the GPU ran 98 % busy under a 30 % share; timed
 * at random alone, 33 %, and 90 % under 70 %; with every launch of such a kind timed, 30.0 and 70.1 %.) */
/* A launch measured but not complete this long after it was recorded: the device runs far behind what was charged
 * (a learned kind whose kernels became long, its unmeasured launches charged the old estimate): admission waits for
 * it (dl_measure_stalled), so that an estimate that lags cannot queue more than this much work. */
#define STALL_NS 20000000LL
#define SAMPLE_AFTER 8
#define SAMPLE_EVERY 8
/* ... or fewer, of a kind whose kernels are short: a timed launch costs the host about 3.5 us (two event records and
 * the queries), which at one in 8 launches of 2 us kernels was 0.45 us a launch, a tenth of the host's launch time
 * (46 % busy without the library, 39 % with it at any cap above). One in up to SAMPLE_MOST, so that the launches one
 * timed launch stands for hold the device SAMPLE_SPAN_NS by their estimate. */
#define SAMPLE_MOST 64
#define SAMPLE_SPAN_NS 128000LL
#define SPREAD_TIMED_ALL 5
#define SPREAD_NOISE_NS 1000 /* less is the bracket's own jitter (its gaps' p10-p90: 0.6 us on an H200) */
/* The draws are SipHash-2-4 of a counter under a key from getrandom(), made when the process (or a forked child)
 * first draws: a tenant that knows the code still cannot tell which of its launches will be timed, and so cannot
 * make the timed ones short and the others long (with a fixed seed it could replay the sequence: t_launch
 * predicted). 64 bits are drawn at a time, three used per launch. Under mu. */
static uint64_t sip_key[2], sip_counter, sample_bits;
static int sample_left, sample_seeded;

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                                       \
    do {                                                                                                               \
        v0 += v1, v1 = ROTL(v1, 13), v1 ^= v0, v0 = ROTL(v0, 32);                                                      \
        v2 += v3, v3 = ROTL(v3, 16), v3 ^= v2;                                                                         \
        v0 += v3, v3 = ROTL(v3, 21), v3 ^= v0;                                                                         \
        v2 += v1, v1 = ROTL(v1, 17), v1 ^= v2, v2 = ROTL(v2, 32);                                                      \
    } while (0)

/* SipHash-2-4 of one 64-bit word. */
static uint64_t siphash(const uint64_t k[2], uint64_t m) {
    uint64_t v0 = k[0] ^ 0x736f6d6570736575ull, v1 = k[1] ^ 0x646f72616e646f6dull;
    uint64_t v2 = k[0] ^ 0x6c7967656e657261ull, v3 = k[1] ^ 0x7465646279746573ull;
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
    uint64_t b = 8ull << 56;
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static void seed_sampling(void) {
    uint64_t k[2] = {0, 0};
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        /* No entropy yet (early boot) or no getrandom: the clock and the address space, which the tenant cannot
         * read back from the timed launches either. */
        k[0] = dl_hash64(dl_now_ns() ^ (uint64_t)(uintptr_t)&k);
        k[1] = dl_hash64(k[0] ^ (uint64_t)getpid());
    }
    sip_key[0] = k[0];
    sip_key[1] = k[1];
    sample_seeded = 1;
}

/* Whether this launch is timed: one in 2^bits. */
static int sample_drawn(int bits) {
    if (DL_UNLIKELY(!sample_seeded)) seed_sampling();
    if (sample_left < bits) {
        sample_bits = siphash(sip_key, sip_counter++);
        sample_left = 64;
    }
    int drawn = (sample_bits & ((1u << bits) - 1)) == 0;
    sample_bits >>= bits;
    sample_left -= bits;
    return drawn;
}
static int64_t average_ns; /* estimate for a launch never measured; 0 until the first measurement */

/* The first launch of a kind never measured, being measured (since: when it was admitted; 0: none). */
static struct {
    uint64_t key;
    int64_t since;
} probes[EST_SLOTS], probing;       /* probing: the latest first launch of any kind, while it is being measured */
#define PROBE_WAIT_NS 20000000LL    /* longest a launch waits for the first measurement of its kind */
#define PROBE_SLICE_NS 50000LL      /* between two looks at it */
#define PROBE_STALE_NS 1000000000LL /* a first measurement this late is given up */

int64_t dl_measure_stalled(int64_t now) {
    int64_t r = atomic_load_explicit(&oldest_recorded, memory_order_relaxed);
    return r && now - r > STALL_NS ? now - r : 0;
}

int64_t dl_measure_queued_ahead(int dev, int64_t now) {
    return atomic_load_explicit(&queued_until[dev % DL_MAX_DEVICES], memory_order_relaxed) - now;
}

/* The final figure of a launch's GPU time: the claim's busy time (region.c) and its activity file (arbiter.c). */
static void charged(int dev, int64_t ns) {
    dl_region_add_busy(dev, ns);
    dl_arbiter_charged(dev, ns);
}

static void dl_measure_reset_after_fork(void) {
    /* Events belong to the parent's contexts, which the child does not have. */
    pthread_mutex_init(&mu, NULL);
    memset(ring, 0, sizeof ring);
    ring_head = ring_count = 0;
    memset(pools, 0, sizeof pools);
    memset(probes, 0, sizeof probes);
    memset(&probing, 0, sizeof probing);
    atomic_store(&polling, 0);
    for (int i = 0; i < DL_MAX_DEVICES; i++) atomic_store(&queued_until[i], 0), atomic_store(&queued_sum[i], 0);
    atomic_store(&reaping, 0); /* the parent's reaper thread is not the child's */
    atomic_store(&reaper_polling, 0);
    atomic_store(&oldest_recorded, 0);
    sample_seeded = 0; /* the child draws its own key: it must not repeat the parent's sequence */
    sample_left = 0;
}
DL_FORK_HANDLERS(DL_FORK_MEASURE, NULL, NULL, dl_measure_reset_after_fork);

/* The kernel's own time in a bracket of events: the bracket less what it holds besides the kernel (the gaps,
 * the host's time while the device was idle), never below MIN_CHARGE_NS (nor above the bracket). */
static int64_t kernel_time(int64_t bracket, int64_t extra_ns) {
    int64_t k = bracket - extra_ns;
    int64_t floor = bracket < MIN_CHARGE_NS ? bracket : MIN_CHARGE_NS;
    return k > floor ? k : floor;
}

static int64_t estimate(uint64_t key) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    return estimates[i].key == key ? estimates[i].ns : average_ns ? average_ns : PRIOR_NS;
}

static void learn(uint64_t key, int64_t ns) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    int same = estimates[i].key == key;
    int64_t off = same ? ns - estimates[i].ns : 0;
    estimates[i].spread_ns = same ? (3 * estimates[i].spread_ns + (off < 0 ? -off : off)) / 4 : 0;
    estimates[i].ns = same ? (3 * estimates[i].ns + ns) / 4 : ns;
    estimates[i].measured = same ? estimates[i].measured + (estimates[i].measured < UINT32_MAX) : 1;
    if (!same) estimates[i].untimed = 0;
    estimates[i].key = key;
    average_ns = average_ns ? (7 * average_ns + ns) / 8 : ns;
    if (probes[i].key == key) probes[i].since = 0;
    if (probing.key == key) probing.since = 0;
    if (probing.key == key) probing.since = 0;
}

/* A first launch that will not be measured after all: the next of its kind becomes the first. Caller holds mu. */
static void probe_dropped(uint64_t key) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    if (probes[i].key == key) probes[i].since = 0;
    if (probing.key == key) probing.since = 0;
}

/* Spare timing events per context. mu guards the tables only: every driver call (creating, destroying,
 * querying events, switching contexts) happens with no lock held. */
static struct pool *pool_for(CUcontext ctx, int create) {
    struct pool *free_pool = NULL;
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].ctx == ctx) return &pools[i];
        if (!pools[i].ctx && !free_pool) free_pool = &pools[i];
    }
    if (create && free_pool) free_pool->ctx = ctx;
    return create ? free_pool : NULL;
}

static void put_event(CUcontext ctx, CUevent e) {
    pthread_mutex_lock(&mu);
    struct pool *p = pool_for(ctx, 1);
    int kept = p && p->n < POOL_EVENTS;
    if (kept) p->ev[p->n++] = e;
    pthread_mutex_unlock(&mu);
    if (!kept) dl_cuda.cuEventDestroy_v2(e);
}

/* An event of the context ctx (made current around the creation when it is not). */
static int get_event(CUcontext ctx, CUevent *e) {
    pthread_mutex_lock(&mu);
    struct pool *p = pool_for(ctx, 1);
    int pooled = p && p->n > 0;
    if (pooled) *e = p->ev[--p->n];
    pthread_mutex_unlock(&mu);
    if (pooled) return 0;
    CUcontext current = NULL;
    if (dl_cuda.cuCtxGetCurrent(&current) != CUDA_SUCCESS) current = NULL;
    if (ctx == current) return dl_cuda.cuEventCreate(e, CU_EVENT_DEFAULT) == CUDA_SUCCESS ? 0 : -1;
    if (!dl_cuda.cuCtxPushCurrent_v2 || !dl_cuda.cuCtxPopCurrent_v2 || dl_cuda.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return -1;
    int r = dl_cuda.cuEventCreate(e, CU_EVENT_DEFAULT) == CUDA_SUCCESS ? 0 : -1;
    CUcontext popped;
    dl_cuda.cuCtxPopCurrent_v2(&popped);
    return r;
}

/* Before a context is destroyed (cuCtxDestroy, or the primary context released or reset): its spare events
 * are destroyed while it still exists, and launches being timed with its events are dropped (they keep
 * their estimate), so no event of a destroyed context is ever used again - a new context may get the same
 * address. ctx NULL: every context (the primary context of a device we cannot name). */
static void forget_context(CUcontext ctx) {
    CUevent doomed[POOLS * (POOL_EVENTS + 1) + 2 * RING];
    int n = 0;
    /* The poller may be between reading the ring's head and applying it: let it finish first. */
    for (int expected = 0; !atomic_compare_exchange_weak(&polling, &expected, 1); expected = 0) sched_yield();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < POOLS; i++) {
        if (!pools[i].ctx || (ctx && pools[i].ctx != ctx)) continue;
        for (int k = 0; k < pools[i].n; k++) doomed[n++] = pools[i].ev[k];
        if (pools[i].anchor_ns) doomed[n++] = pools[i].anchor;
        pools[i].anchor_ns = 0;
        pools[i].n = 0;
        pools[i].ctx = NULL;
    }
    for (unsigned k = 0; k < ring_count; k++) {
        struct pending *p = &ring[(ring_head + k) % RING];
        if (!p->ctx || (ctx && p->ctx != ctx)) continue;
        doomed[n++] = p->start;
        doomed[n++] = p->end;
        p->ctx = NULL; /* the poller skips it */
        probe_dropped(p->key);
    }
    pthread_mutex_unlock(&mu);
    atomic_store(&polling, 0);
    for (int i = 0; i < n; i++) dl_cuda.cuEventDestroy_v2(doomed[i]);
}

static CUresult elapsed_ms(float *ms, CUevent a, CUevent b) {
    return dl_cuda.cuEventElapsedTime_v2 ? dl_cuda.cuEventElapsedTime_v2(ms, a, b)
                                         : dl_cuda.cuEventElapsedTime(ms, a, b);
}

/* Applies the measurements of launches that have completed, oldest first. One thread at a time (the
 * others go on without waiting). The ring's tables are read and updated under mu, once per batch: the
 * pending entries are copied out, their events queried without the lock, then what completed is learnt,
 * its events pooled and the head advanced in one more look at the tables. */
#define POLL_BATCH 32
/* A launch of the device was seen done at now, when the device's queued_sum had reached sum at its launch: what
 * is queued now ends no later than what was launched since, from now. */
static void done_by(int dev, int64_t sum, int64_t now) {
    _Atomic int64_t *q = &queued_until[dev % DL_MAX_DEVICES];
    int64_t most = now + atomic_load_explicit(&queued_sum[dev % DL_MAX_DEVICES], memory_order_relaxed) - sum;
    int64_t until = atomic_load_explicit(q, memory_order_relaxed);
    while (until > most &&
           !atomic_compare_exchange_weak_explicit(q, &until, most, memory_order_relaxed, memory_order_relaxed)) {}
}
/* What a launch drawn at random to be timed (one in SAMPLE_EVERY or more of a learned kind) settles for the launches
 * of its kind that were not timed: each was charged the estimate it was charged, so its measurement's difference from
 * that estimate is theirs too, stands_for - 1 times over (in expectation: the draws are random). A kind whose kernels
 * turn long is so charged for the launches that ran at the old estimate, as their timed ones complete, not only
 * from the first of them on (t_launch changed-short: a kind learned at 2 us that turned 1 ms kept a 30 % claim
 * 70 % busy over the second after the change); one that turns short is given back what they were overcharged,
 * never more than they were charged. */
static int64_t settled_with(int stands_for, int64_t actual, int64_t charged_ns) {
    int64_t off = actual - charged_ns, size = off < 0 ? -off : off;
    /* Only a measurement that the kind's spread would not explain (the test of SPREAD_TIMED_ALL): within it, the
     * estimate is right on average, and a difference multiplied would only be noise - one the clock does not
     * even keep when it is a credit that falls behind wall time (an idle claim earns nothing), so that the
     * claim would run below its share (a 90 % cap with 50 us kernels: 86 %). */
    if (stands_for <= 1 || size <= SPREAD_NOISE_NS || size * SPREAD_TIMED_ALL <= charged_ns) return 0;
    return (int64_t)(stands_for - 1) * off;
}
static __thread int in_reaper; /* this thread is the reaper: it also charges the oldest launch as it runs */
static void poll_completed(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&polling, &expected, 1)) return;
    for (;;) {
        struct pending batch[POLL_BATCH];
        int64_t actual[POLL_BATCH];
        pthread_mutex_lock(&mu);
        unsigned n = ring_count < POLL_BATCH ? ring_count : POLL_BATCH;
        for (unsigned k = 0; k < n; k++) batch[k] = ring[(ring_head + k) % RING];
        pthread_mutex_unlock(&mu);
        unsigned done = 0;
        for (; done < n; done++) {
            struct pending *p = &batch[done];
            actual[done] = -1;
            if (!p->ctx) continue; /* its context was destroyed: forget_context took its events */
            CUresult q = dl_cuda.cuEventQuery(p->end);
            if (q == CUDA_ERROR_NOT_READY) break;
            float ms;
            if (q == CUDA_SUCCESS) done_by(p->dev, p->queued_sum, (int64_t)dl_now_ns());
            if (q == CUDA_SUCCESS && elapsed_ms(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0) {
                int64_t bracket = (int64_t)((double)ms * 1e6);
                actual[done] = kernel_time(bracket, p->extra_ns);
                /* A start event reached at an unknown time between its record and the launch's return: the kernel
                 * took between the bracket less all that host time and the bracket less none of it. Within that, the
                 * charge stands (the measurements whose start is known move it); outside, the nearer end. */
                int64_t least = kernel_time(bracket, p->extra_ns + p->unsure_ns);
                /* When, on the host's clock, the start was reached: an anchor's time and the events' distance. */
                pthread_mutex_lock(&mu);
                struct pool *pl = p->unsure_ns ? pool_for(p->ctx, 0) : NULL;
                CUevent anchor = pl && pl->anchor_ns && p->recorded_ns - pl->anchor_ns < ANCHOR_AGE_NS ? pl->anchor : 0;
                int64_t anchor_ns = anchor ? pl->anchor_ns : 0;
                pthread_mutex_unlock(&mu);
                float since;
                if (anchor && elapsed_ms(&since, anchor, p->start) == CUDA_SUCCESS && since >= 0) {
                    int64_t host = p->returned_ns - anchor_ns - (int64_t)((double)since * 1e6);
                    host = host < 0 ? 0 : host > p->unsure_ns ? p->unsure_ns : host;
                    actual[done] = kernel_time(bracket, p->extra_ns + host);
                } else if (p->unsure_ns)
                    actual[done] = p->charged_ns < least          ? least
                                   : p->charged_ns > actual[done] ? actual[done]
                                                                  : p->charged_ns;
                /* An end event stamped when it was recorded holds the host's delay after the kernel (however long the
                 * thread was preempted): the kernel took no longer than the bracket says, and no more is known. */
                if (p->end_late && actual[done] > p->charged_ns) actual[done] = p->charged_ns;
                atomic_fetch_add(dl_region_tat(p->dev),
                                 dl_wall_cost(p->dev, actual[done] - p->charged_ns - p->accrued_ns +
                                                          settled_with(p->stands_for, actual[done], p->charged_ns)));
                charged(p->dev, actual[done]);
            }
        }
        /* The reaper charges the oldest launch still running as it runs: once its start event is reached, the time
         * since then beyond its charge is the claim's debt already (the measurement settles the rest). A kernel of
         * a second then holds the claim's other processes back while it runs, not only after it. */
        int64_t started = 0, accrued = 0;
        if (in_reaper && done < n && batch[done].ctx && dl_cuda.cuEventQuery(batch[done].start) == CUDA_SUCCESS) {
            struct pending *p = &batch[done];
            int64_t now = (int64_t)dl_now_ns();
            started = p->started_ns ? p->started_ns : now;
            int64_t over = now - started - p->charged_ns - p->accrued_ns;
            accrued = p->accrued_ns + (over > 0 ? over : 0);
            if (over > 0) atomic_fetch_add(dl_region_tat(p->dev), dl_wall_cost(p->dev, over));
        }
        /* Events that cannot be pooled (unusable, or the pool is full) are destroyed without the lock. */
        CUevent doomed[2 * POLL_BATCH];
        int nd = 0;
        pthread_mutex_lock(&mu);
        if (started) {
            ring[(ring_head + done) % RING].started_ns = started;
            ring[(ring_head + done) % RING].accrued_ns = accrued;
        }
        for (unsigned k = 0; k < done; k++) {
            struct pending *p = &batch[k];
            if (!p->ctx) continue;
            if (actual[k] < 0) {
                doomed[nd++] = p->start;
                doomed[nd++] = p->end;
                probe_dropped(p->key);
                continue;
            }
            learn(p->key, actual[k]);
            struct pool *pl = pool_for(p->ctx, 1);
            CUevent ev[2] = {p->start, p->end};
            if (pl && p->idle_start && p->recorded_ns > pl->anchor_ns) { /* the newer anchor; the old one is spare */
                CUevent old = pl->anchor;
                int had = pl->anchor_ns != 0;
                pl->anchor = p->start;
                pl->anchor_ns = p->recorded_ns;
                ev[0] = had ? old : NULL;
            }
            for (int e = 0; e < 2; e++) {
                if (!ev[e]) continue;
                if (pl && pl->n < POOL_EVENTS) pl->ev[pl->n++] = ev[e];
                else doomed[nd++] = ev[e];
            }
        }
        ring_head = (ring_head + done) % RING;
        ring_count -= done;
        if (done)
            atomic_store_explicit(&oldest_recorded, ring_count ? ring[ring_head].recorded_ns : 0, memory_order_relaxed);
        pthread_mutex_unlock(&mu);
        for (int k = 0; k < nd; k++) dl_cuda.cuEventDestroy_v2(doomed[k]);
        if (done < n || n < POLL_BATCH) break;
    }
    atomic_store(&polling, 0);
}

/* Polls unless that could disturb an open capture. */
void dl_measure_poll(void) {
    if (!atomic_load_explicit(&dl_captures, memory_order_relaxed)) {
        poll_completed();
        return;
    }
    int saved = dl_capture_relax();
    if (saved < 0) return; /* a capture is open and this thread cannot be relaxed: measurements wait */
    poll_completed();
    dl_capture_restore(saved);
}

/* A kind of launch never measured is admitted once at the estimate of an unknown launch (the average, or the
 * prior) and measured; a burst of it must not follow at that estimate (a queue of long kernels would keep the
 * device busy far beyond the share before the first measurement came back). So the next launches of that kind
 * wait - polling, at most PROBE_WAIT_NS - for the first one's measurement and are admitted at the learned
 * cost; one that waited out the bound is charged at least as long as the first has been running (the
 * measurement settles the difference, either way). Nor may a stream of kinds that are each new run ahead of their
 * measurements at the estimate of an unknown launch (t_launch new-kinds: a queue of them kept a 30 % claim's GPU
 * busy for twice its share at first): the first launch of a new kind waits, the same way, for the first launch of
 * any other kind still being measured. A workload's first step, all of it new kinds, is admitted one new kind
 * at a time. Returns whether this launch is the first of its kind; *now
 * is brought up to date after a wait; *floor: the least this launch is charged. */
static int probe(int dev, uint64_t key, int64_t *now, int64_t *floor) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    *floor = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        int known = estimates[i].key == key;
        int64_t since = probes[i].key == key ? probes[i].since : 0;
        if (since && *now - since > PROBE_STALE_NS) since = 0;
        int64_t other =
            probing.since && probing.key != key && *now - probing.since <= PROBE_STALE_NS ? probing.since : 0;
        int first = !known && !since && !other;
        if (first) {
            probes[i].key = probing.key = key;
            probes[i].since = probing.since = *now;
        }
        pthread_mutex_unlock(&mu);
        if (known) return 0;
        if (first) return 1;
        int64_t waited = *now - (since ? since : other);
        if (waited >= PROBE_WAIT_NS) {
            *floor = waited;
            return 0;
        }
        int64_t left = PROBE_WAIT_NS - waited;
        int64_t before_sleep = *now;
        dl_sleep_ns(left < PROBE_SLICE_NS ? left : PROBE_SLICE_NS);
        dl_measure_poll();
        *now = (int64_t)dl_now_ns();
        dl_region_add_throttled(dev, *now - before_sleep);
    }
}

/* Whether the driver has everything timing a launch needs (an old one may lack a variant). */
static int can_time(int ptsz) {
    return dl_cuda.cuEventCreate && dl_cuda.cuEventDestroy_v2 && dl_cuda.cuEventQuery && dl_cuda.cuCtxGetCurrent &&
           (ptsz ? dl_cuda.cuEventRecord_ptsz : dl_cuda.cuEventRecord) &&
           (dl_cuda.cuEventElapsedTime || dl_cuda.cuEventElapsedTime_v2);
}

/* Calls fn(a, b, ptsz) with ctx current. Tried as it is first: the launch's thread almost always has the
 * stream's context current, and then this costs nothing; otherwise (no current context, as with a
 * context-less CUkernel, or another device's) ctx is pushed around a second try - the driver needs a current
 * context to record an event or synchronise a stream. */
static CUresult in_context(CUcontext ctx, CUresult (*fn)(void *, CUstream, int), void *a, CUstream s, int ptsz) {
    CUresult r = fn(a, s, ptsz);
    if (r == CUDA_SUCCESS || !ctx || !dl_cuda.cuCtxPushCurrent_v2 || !dl_cuda.cuCtxPopCurrent_v2) return r;
    CUcontext current = NULL;
    if (dl_cuda.cuCtxGetCurrent && dl_cuda.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) return r;
    if (dl_cuda.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) return r;
    r = fn(a, s, ptsz);
    CUcontext popped;
    dl_cuda.cuCtxPopCurrent_v2(&popped);
    return r;
}

static CUresult record_fn(void *e, CUstream s, int ptsz) {
    return ptsz ? dl_cuda.cuEventRecord_ptsz((CUevent)e, s) : dl_cuda.cuEventRecord((CUevent)e, s);
}

static CUresult record(CUcontext ctx, CUevent e, CUstream s, int ptsz) {
    return in_context(ctx, record_fn, e, s, ptsz);
}

static CUresult sync_fn(void *unused, CUstream s, int ptsz) {
    (void)unused;
    PFN_cuStreamSynchronize_v2000 sync = ptsz ? dl_cuda.cuStreamSynchronize_ptsz : dl_cuda.cuStreamSynchronize;
    return sync ? sync(s) : CUDA_ERROR_NOT_FOUND;
}

/* One log line per kind of launch the limiter cannot attribute or time. */
static _Atomic int warned_device, warned_timing, warned_reaper;
static void warn_once(_Atomic int *flag, const char *what) {
    if (!atomic_exchange_explicit(flag, 1, memory_order_relaxed)) dl_warn("%s", what);
}

/* The device a launch runs on: the stream's. Unknown (no context, no stream that tells): the claim's first
 * device, so the launch still counts. */
/* The context current to this thread, and its device, as last seen: contexts rarely change between two
 * launches, and a context destroyed or reset since (dl_ctx_epoch) is never trusted. */
static __thread __attribute__((tls_model("initial-exec"))) struct { /* read on every launch: no __tls_get_addr */
    CUcontext ctx;
    int ordinal;
    unsigned epoch;
} seen;

static int context_ordinal(CUcontext ctx) {
    unsigned epoch = atomic_load_explicit(&dl_ctx_epoch, memory_order_acquire);
    if (ctx && ctx == seen.ctx && epoch == seen.epoch) return seen.ordinal;
    int o = dl_current_ordinal();
    seen.ctx = ctx;
    seen.ordinal = o;
    seen.epoch = epoch;
    return o;
}

/* Where a launch runs: the region device and the context whose events can time it (the stream's). A device
 * that cannot be told is the claim's first, so the launch still counts. ask_stream 0: the stream may be
 * capturing (a capture is open and cuStreamIsCapturing cannot tell), and a capturing stream must not be asked
 * for its device or context (the real driver invalidates the capture): the current context's is taken. */
static int launch_target(CUstream stream, int ptsz, int ask_stream, CUcontext *ctx) {
    int ordinal;
    if ((uintptr_t)stream <= 2u || !ask_stream) {
        if (!dl_cuda.cuCtxGetCurrent || dl_cuda.cuCtxGetCurrent(ctx) != CUDA_SUCCESS) *ctx = NULL;
        ordinal = *ctx ? context_ordinal(*ctx) : -1;
    } else {
        ordinal = dl_stream_ordinal(stream, ptsz);
        PFN_cuStreamGetCtx_v9020 get = ptsz ? dl_cuda.cuStreamGetCtx_ptsz : dl_cuda.cuStreamGetCtx;
        if (!get || get(stream, ctx) != CUDA_SUCCESS) *ctx = NULL;
    }
    int dev = ordinal >= 0 ? dl_device_for_ordinal(ordinal, NULL) : -1;
    if (dev >= 0) return dev;
    for (int o = 0; o < DL_MAX_DEVICES && dev < 0; o++) dev = dl_device_for_ordinal(o, NULL);
    if (dev >= 0)
        warn_once(
            &warned_device,
            "a launch whose device cannot be told (no context, no stream) is counted on the claim's first device");
    return dev;
}

static void drop_probe(struct dl_ticket *t) {
    if (!t->first) return;
    pthread_mutex_lock(&mu);
    probe_dropped(t->key);
    pthread_mutex_unlock(&mu);
    t->first = 0;
}

#define POLL_NS 20000     /* completed measurements are looked for at most this often (and when the ring fills) */
#define POLL_SOON_NS 2000 /* or this often while spare events run short: the oldest may still be running */
static _Atomic int64_t last_poll;

/* Makes the next poll due within POLL_SOON_NS of now (never later than it already was). */
static void poll_soon(int64_t now, int64_t polled) {
    int64_t due = now - POLL_NS + POLL_SOON_NS;
    if (polled > due) atomic_store_explicit(&last_poll, due, memory_order_relaxed);
}

/* The reaper: GPU time is the claim's debt from the moment work is launched, whether or not the launching process
 * ever calls CUDA again. A launch is charged its estimate at admission; what its measurement adds (a kernel longer
 * than its estimate, a new kind's first launch) is applied by whichever thread polls first - and, so that a
 * process that launches and then goes quiet is charged all the same, by a thread of the library that polls every
 * REAP_NS while measurements are pending, and charges the oldest launch still running as it runs (t_launch quiet: without it, a second process of the claim ran its whole
 * share beside the quiet one's 1 s kernel). It starts with the first measured launch, and ends after a second
 * with nothing pending (the next measured launch starts it again). Signals are blocked in it: the application's
 * handlers never run there. */
#define REAP_NS 1000000LL
#define REAP_IDLE_ROUNDS 1000

static int pending_count(void) {
    pthread_mutex_lock(&mu);
    int n = (int)ring_count;
    pthread_mutex_unlock(&mu);
    return n;
}

/* At exit the driver's own destructors run after the handlers registered later than they were (the reaper's, below):
 * the reaper leaves the driver alone from then on, and a poll it is in is waited for (100 ms at most). */
static void reaper_stop(void) {
    atomic_store(&exiting, 1);
    for (int i = 0; i < 1000 && atomic_load(&reaper_polling); i++) dl_sleep_ns(100000);
}

static void *reaper(void *unused) {
    (void)unused;
    in_reaper = 1;
    /* Its calls must never invalidate an application's global-mode capture, which another thread may begin at any
     * moment (even between a look at whether one is open and the query that follows): this thread's capture mode
     * stays relaxed for good. A driver that cannot relax it gets no reaper: its launching threads poll. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!dl_cuda.cuThreadExchangeStreamCaptureMode ||
        dl_cuda.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) {
        atomic_store(&no_reaper, 1);
        atomic_store(&reaping, 0);
        return NULL;
    }
    for (int idle = 0;;) {
        dl_sleep_ns(REAP_NS);
        if (atomic_load(&exiting)) return NULL;
        if (pending_count()) {
            idle = 0;
            atomic_store(&reaper_polling, 1);
            if (!atomic_load(&exiting)) dl_measure_poll();
            atomic_store(&reaper_polling, 0);
            continue;
        }
        if (++idle < REAP_IDLE_ROUNDS) continue;
        atomic_store(&reaping, 0);
        /* A launch that queued a measurement just now saw the reaper running: take it on again. */
        int expected = 0;
        if (!pending_count() || !atomic_compare_exchange_strong(&reaping, &expected, 1)) return NULL;
        idle = 0;
    }
}

static void start_reaper(void) {
    int expected = 0;
    if (atomic_load(&exiting) || atomic_load(&no_reaper) || !atomic_compare_exchange_strong(&reaping, &expected, 1))
        return;
    if (!atomic_exchange(&exit_hook, 1)) atexit(reaper_stop);
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    pthread_attr_t attr;
    pthread_t th;
    int ok = pthread_attr_init(&attr) == 0;
    if (ok) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    ok = ok && pthread_create(&th, &attr, reaper, NULL) == 0;
    if (ok) pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (!ok) {
        atomic_store(&reaping, 0);
        warn_once(&warned_reaper, "cannot start the thread that applies measurements; they wait for the next launch");
    }
}

/* What admission (admission.c) asks of the launches being measured while a launch waits. */
static const struct dl_measured measured = {dl_measure_poll, dl_measure_queued_ahead, dl_measure_stalled};
static int start_pending(CUevent start);

void dl_ticket_open(struct dl_ticket *t, uint64_t key, CUstream stream, int ptsz) {
    t->dev = -1;
    t->first = 0;
    t->measure = 0;
    t->stands_for = 1;
    /* No capture open in the process (every way to begin one is wrapped): no stream can be capturing. */
    int capture_known = 1;
    if (atomic_load_explicit(&dl_captures, memory_order_relaxed)) {
        int status = dl_stream_capture_status(stream, ptsz);
        if (status == 1) return; /* charged when the graph runs */
        capture_known = status == 0;
    }
    t->ctx = NULL;
    int dev = launch_target(stream, ptsz, capture_known, &t->ctx);
    if (dev < 0) return; /* no device of a claim in this process: nothing to charge */

    int have_ctx = capture_known && t->ctx && can_time(ptsz);
    int64_t now = (int64_t)dl_now_ns();
    int64_t polled = atomic_load_explicit(&last_poll, memory_order_relaxed);
    if (now - polled >= POLL_NS) { /* or sooner: last_poll is reset when the ring fills or events run short */
        atomic_store_explicit(&last_poll, now, memory_order_relaxed);
        dl_measure_poll();
    }
    t->key = key;
    int64_t floor = 0;
    unsigned slot = (unsigned)(key & (EST_SLOTS - 1));
    /* One look at the tables: whether the kind was measured, the ring's room, two pooled events, the estimate. A
     * kind never measured is probed first, with the lock released (probe may wait). */
    int got = 0;
    pthread_mutex_lock(&mu);
    if (have_ctx && estimates[slot].key != key) {
        pthread_mutex_unlock(&mu);
        t->first = probe(dev, key, &now, &floor);
        pthread_mutex_lock(&mu);
    }
    int ring_full = ring_count >= RING; /* then the estimate stands: later launches are measured */
    if (ring_count >= RING / 2) atomic_store_explicit(&last_poll, 0, memory_order_relaxed); /* poll next time */
    /* A launch whose kind has been measured often enough, with times that agree, is timed one time in SAMPLE_EVERY (up
     * to SAMPLE_MOST when short), at random; the others are charged the estimate that those measurements keep
     * current. */
    int every = estimates[slot].key != key || estimates[slot].measured < SAMPLE_AFTER ||
                (estimates[slot].spread_ns > SPREAD_NOISE_NS &&
                 estimates[slot].spread_ns * SPREAD_TIMED_ALL > estimates[slot].ns);
    int bits = 3; /* log2(SAMPLE_EVERY) */
    while ((1 << bits) < SAMPLE_MOST && (estimates[slot].ns << bits) < SAMPLE_SPAN_NS) bits++;
    int sample = every || sample_drawn(bits);
    /* A timed launch stands for itself and the launches of its kind charged the estimate since the one timed before
     * (as many as the draws made: 1 << bits on average, but the count is exact, not a multiple of an average). */
    int same = estimates[slot].key == key;
    t->stands_for = every || !same ? 1 : (int)estimates[slot].untimed + 1;
    if (same) estimates[slot].untimed = sample ? 0 : estimates[slot].untimed + (estimates[slot].untimed < 1u << 20);
    struct pool *p = have_ctx && !ring_full && sample ? pool_for(t->ctx, 1) : NULL;
    if (p && p->n >= 2) {
        t->end = p->ev[--p->n];
        t->start = p->ev[--p->n];
        got = 2;
    }
    /* Spare events running short while measured launches wait in the ring: poll soon rather than make events
     * the next poll would have to destroy again - but not on every launch, which would query the oldest
     * launch's event again and again while it runs (the fake-driver bench polled on one launch in 8 so). */
    if (p && p->n < 4 && ring_count) poll_soon(now, polled);
    t->charged_ns = estimate(key);
    if (t->charged_ns < floor) t->charged_ns = floor;
    if (t->first && (ring_full || !p)) { /* it will not be measured: not the first after all */
        probe_dropped(key);
        t->first = 0;
    }
    pthread_mutex_unlock(&mu);
    if (have_ctx && !ring_full && sample && !got && get_event(t->ctx, &t->start) == 0) {
        if (get_event(t->ctx, &t->end) == 0) got = 2;
        else put_event(t->ctx, t->start);
    }
    t->measure = got == 2;
    if (t->first && !t->measure) drop_probe(t);
    /* A stream that may be capturing is neither timed by events nor synchronised: it keeps its estimate. */
    int untimed = !t->measure && !ring_full && sample && capture_known;
    if (untimed)
        warn_once(&warned_timing,
                  "launches that cannot be timed by events are timed by synchronising their stream (an upper bound)");

    t->dev = dev;
    dl_admit(dev, t->charged_ns, now, &measured);
    if (t->measure && record(t->ctx, t->start, stream, ptsz) != CUDA_SUCCESS) {
        dl_cuda.cuEventDestroy_v2(t->start);
        dl_cuda.cuEventDestroy_v2(t->end);
        drop_probe(t);
        t->measure = 0;
        untimed = 1;
        warn_once(&warned_timing,
                  "launches that cannot be timed by events are timed by synchronising their stream (an upper bound)");
    }
    if (t->measure) {
        t->recorded = (int64_t)dl_now_ns();
        t->backlog = start_pending(t->start); /* 0: the device was idle, the start is stamped now */
    }
    /* Without events the launch is timed from admission to the end of its stream's work: an upper bound
     * (it includes what was queued before), so the share errs on the side of the limit. */
    t->synced = untimed ? (int64_t)dl_now_ns() : 0;
}

static void sync_timed(struct dl_ticket *t, CUstream stream, int ptsz) {
    /* Synchronising a stream is forbidden to a thread in global or thread-local mode while a capture is open
     * (the real driver's record): relaxed, as the event polls are, so that it cannot invalidate the capture. */
    int saved = dl_capture_relax();
    CUresult r = in_context(t->ctx, sync_fn, NULL, stream, ptsz);
    dl_capture_restore(saved);
    if (r != CUDA_SUCCESS) return; /* keeps the estimate */
    int64_t actual = (int64_t)dl_now_ns() - t->synced;
    atomic_fetch_add(dl_region_tat(t->dev), dl_wall_cost(t->dev, actual - t->charged_ns));
    charged(t->dev, actual);
}

/* Whether the device has not yet reached a start event (a query, relaxed while a capture is open). */
static int start_pending(CUevent start) {
    int saved = dl_capture_relax();
    CUresult q = dl_cuda.cuEventQuery(start);
    dl_capture_restore(saved);
    return q == CUDA_ERROR_NOT_READY;
}

/* The launch is queued now: our work on the device ends its estimate (and a launch gap) later - the gap of a
 * launch onto an idle device, or of one queued behind our work (a bracketed launch's events hold the device too). */
static int64_t launched(struct dl_ticket *t) {
    int64_t now = (int64_t)dl_now_ns();
    _Atomic int64_t *q = &queued_until[t->dev % DL_MAX_DEVICES];
    int64_t until = atomic_load_explicit(q, memory_order_relaxed), next;
    int64_t gap = t->measure ? GAP_PENDING_NS : GAP_QUEUED_NS;
    do next = (until > now ? until + gap : now + GAP_IDLE_NS) + t->charged_ns;
    while (!atomic_compare_exchange_weak_explicit(q, &until, next, memory_order_relaxed, memory_order_relaxed));
    t->queued_sum =
        atomic_fetch_add_explicit(&queued_sum[t->dev % DL_MAX_DEVICES], gap + t->charged_ns, memory_order_relaxed) +
        gap + t->charged_ns;
    return now;
}

void dl_ticket_close(struct dl_ticket *t, CUresult r, CUstream stream, int ptsz) {
    if (t->dev < 0) return;
    int64_t returned = r == CUDA_SUCCESS ? launched(t) : 0;
    if (r != CUDA_SUCCESS) {
        /* Nothing will run: refund the charge. */
        atomic_fetch_sub(dl_region_tat(t->dev), dl_wall_cost(t->dev, t->charged_ns));
        drop_probe(t);
        if (t->measure) {
            put_event(t->ctx, t->start);
            put_event(t->ctx, t->end);
        }
        return;
    }
    /* The claim's busy time (the region's figure, what monitoring shows without NVML) counts a launch that is not
     * measured at its charge, the estimate: counting only the measured ones would show one launch in eight. */
    if (!t->measure) {
        if (t->synced) sync_timed(t, stream, ptsz);
        else charged(t->dev, t->charged_ns);
        return;
    }
    if (record(t->ctx, t->end, stream, ptsz) != CUDA_SUCCESS) {
        dl_cuda.cuEventDestroy_v2(t->start);
        dl_cuda.cuEventDestroy_v2(t->end);
        drop_probe(t);
        charged(t->dev, t->charged_ns);
        return;
    }
    /* The device reached the end event as soon as it was recorded: the kernel had ended before, and the event was
     * stamped with the record's time, however late the thread came to it (preempted after the launch returned: a
     * 2 us kernel's bracket held 20 us to 8 ms on a loaded host). */
    int end_late = !start_pending(t->end);
    /* The host time from the start event to the launch's return that no queued work of ours covered. It was
     * in the bracket only if the device reached the start event meanwhile: a start event still pending when
     * the launch returned waited for other work (another process's context holding the device), and the
     * bracket began after the launch's host time. */
    int64_t host = returned - t->recorded;
    int pending = start_pending(t->start);
    /* Reached before the launch returned but not when it was recorded (our earlier work ran then): when, between the
     * two, is not known - the queue's estimate of it moved with the charges it is made of, and kept them wrong. */
    int64_t unsure = !pending && t->backlog && host > 0 ? host : 0;
    int64_t extra = pending ? GAP_PENDING_NS : GAP_IDLE_NS + (!t->backlog && host > 0 ? host : 0);
    /* The device reached the start event before the launch returned: what was queued before it is done, and the queue
     * holds no more than this launch (and any launched since, by other threads). Without that, the queue's estimate
     * runs on from one measured launch's completion to the next poll's (kernels of 2 us launched 4 us apart by the
     * host, each estimated at a queued gap and its charge), and the next bracketed launch takes no host time off. */
    if (!pending) done_by(t->dev, t->queued_sum - GAP_PENDING_NS - t->charged_ns, returned);
    pthread_mutex_lock(&mu);
    int queued = ring_count < RING;
    if (queued) {
        ring[(ring_head + ring_count) % RING] = (struct pending){.ctx = t->ctx,
                                                                 .start = t->start,
                                                                 .end = t->end,
                                                                 .key = t->key,
                                                                 .dev = t->dev,
                                                                 .charged_ns = t->charged_ns,
                                                                 .extra_ns = extra,
                                                                 .recorded_ns = t->recorded,
                                                                 .queued_sum = t->queued_sum,
                                                                 .stands_for = t->stands_for,
                                                                 .end_late = end_late,
                                                                 .unsure_ns = unsure,
                                                                 .returned_ns = returned,
                                                                 .idle_start = !pending && !t->backlog};
        if (ring_count++ == 0) atomic_store_explicit(&oldest_recorded, t->recorded, memory_order_relaxed);
    }
    if (!queued) probe_dropped(t->key);
    pthread_mutex_unlock(&mu);
    if (!queued) {
        put_event(t->ctx, t->start);
        put_event(t->ctx, t->end);
        charged(t->dev, t->charged_ns);
        return;
    }
    if (DL_UNLIKELY(!atomic_load_explicit(&reaping, memory_order_relaxed))) start_reaper();
}

/* ---- context destruction: the events pooled for a context die with it (contexts.c calls this) ---- */

void dl_throttle_forget_context(CUcontext ctx) { forget_context(ctx); }
