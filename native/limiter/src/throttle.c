/*
 * Compute cap: launches are admitted so that the claim's kernels occupy the GPU for `cores` percent of
 * wall time.
 *
 * Algorithm: a rate limiter over *measured GPU time*, shared by every process of the claim.
 *
 *   - Cost of a launch = the GPU time it occupies. It is measured, not guessed from grid sizes: while
 *     throttling, the limiter brackets each launch with a pair of timing events on the launch's stream
 *     and reads cuEventElapsedTime once the end event has completed (polled without blocking on later
 *     launches). Until a measurement arrives, the launch is charged an estimate: the running average of
 *     earlier measurements of the same function and grid size, else of all launches, else (nothing
 *     measured yet) PRIOR_NS. The prior is not zero: a cold process must not admit a queue-full of
 *     launches free of charge before its first measurement comes back.
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
 * Launches recorded into a capturing stream are not executed then: they are neither charged nor
 * measured (the graph is charged when launched, by measuring cuGraphLaunch). While any stream of the
 * process is capturing, completed events are not polled (event queries may invalidate a global-mode
 * capture); measurements wait until the capture ends.
 *
 * The unthrottled path (cores unset or 100) is one predictable branch: no lock, no system call.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "limiter.h"

#define BURST_NS 4000000LL /* how far ahead of wall time admitted work may run */
#define SLICE_NS 2000000LL /* longest sleep between two looks at completed measurements */
#define PRIOR_NS 200000LL  /* charge of a launch when this process has measured none yet */
#define RING 256           /* launches being measured */
#define POOLS 8            /* contexts with spare timing events */
#define POOL_EVENTS 32
#define EST_SLOTS 1024     /* direct-mapped cost estimates */

bool dl_throttle_on;
static int64_t cores = 100;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int captures;

struct pending {
    CUcontext ctx;
    CUevent start, end;
    uint64_t key;
    int dev;
    int64_t charged_ns; /* GPU time charged at admission */
};
static struct pending ring[RING];
static unsigned ring_head, ring_count;

struct pool {
    CUcontext ctx;
    int n;
    CUevent ev[POOL_EVENTS];
};
static struct pool pools[POOLS];

static struct {
    uint64_t key;
    int64_t ns;
} estimates[EST_SLOTS];
static int64_t average_ns; /* estimate for a launch never measured; 0 until the first measurement */

void dl_throttle_configure(int pct) {
    cores = pct;
    dl_throttle_on = pct < 100;
    if (dl_throttle_on) dl_debug("compute share %d%%", pct);
}

void dl_throttle_reset_after_fork(void) {
    /* Events belong to the parent's contexts, which the child does not have. */
    pthread_mutex_init(&mu, NULL);
    memset(ring, 0, sizeof ring);
    ring_head = ring_count = 0;
    memset(pools, 0, sizeof pools);
    atomic_store(&captures, 0);
}

static int64_t wall_cost(int64_t gpu_ns) { return gpu_ns * 100 / cores; }

static uint64_t launch_key(const void *fn, uint64_t blocks) {
    return dl_hash64((uint64_t)(uintptr_t)fn ^ (blocks * 0x9e3779b97f4a7c15ull));
}

static int64_t estimate(uint64_t key) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    return estimates[i].key == key ? estimates[i].ns : average_ns ? average_ns : PRIOR_NS;
}

static void learn(uint64_t key, int64_t ns) {
    unsigned i = (unsigned)(key & (EST_SLOTS - 1));
    estimates[i].ns = estimates[i].key == key ? (3 * estimates[i].ns + ns) / 4 : ns;
    estimates[i].key = key;
    average_ns = average_ns ? (7 * average_ns + ns) / 8 : ns;
}

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
    struct pool *p = pool_for(ctx, 1);
    if (p && p->n < POOL_EVENTS) p->ev[p->n++] = e;
    else dl_cuda.cuEventDestroy_v2(e);
}

static int get_event(CUcontext ctx, CUevent *e) {
    struct pool *p = pool_for(ctx, 1);
    if (p && p->n > 0) {
        *e = p->ev[--p->n];
        return 0;
    }
    return dl_cuda.cuEventCreate(e, CU_EVENT_DEFAULT) == CUDA_SUCCESS ? 0 : -1;
}

static CUresult elapsed_ms(float *ms, CUevent a, CUevent b) {
    return dl_cuda.cuEventElapsedTime_v2 ? dl_cuda.cuEventElapsedTime_v2(ms, a, b) : dl_cuda.cuEventElapsedTime(ms, a, b);
}

/* Applies the measurements of launches that have completed. Caller holds mu. */
static void poll_completed(void) {
    while (ring_count) {
        struct pending *p = &ring[ring_head];
        CUresult q = dl_cuda.cuEventQuery(p->end);
        if (q == CUDA_ERROR_NOT_READY) break;
        float ms;
        if (q == CUDA_SUCCESS && elapsed_ms(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0) {
            int64_t actual = (int64_t)((double)ms * 1e6);
            atomic_fetch_add(dl_region_tat(p->dev), wall_cost(actual - p->charged_ns));
            dl_region_add_busy(p->dev, actual);
            learn(p->key, actual);
            put_event(p->ctx, p->start);
            put_event(p->ctx, p->end);
        } else {
            /* Context gone or events unusable: keep the estimate, drop the events. */
            dl_cuda.cuEventDestroy_v2(p->start);
            dl_cuda.cuEventDestroy_v2(p->end);
        }
        ring_head = (ring_head + 1) % RING;
        ring_count--;
    }
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

static void poll_if_no_capture(void) {
    pthread_mutex_lock(&mu);
    if (!atomic_load(&captures)) poll_completed();
    pthread_mutex_unlock(&mu);
}

/* GCRA admission on the claim's shared clock for this device. */
static void admit(int dev, int64_t wall) {
    _Atomic int64_t *tat = dl_region_tat(dev);
    for (;;) {
        int64_t now = (int64_t)dl_now_ns();
        int64_t t = atomic_load(tat);
        int64_t base = t > now ? t : now;
        if (base - now > BURST_NS) {
            int64_t wait = base - now - BURST_NS;
            sleep_ns(wait < SLICE_NS ? wait : SLICE_NS);
            dl_region_add_throttled(dev, (int64_t)dl_now_ns() - now);
            poll_if_no_capture();
            continue;
        }
        if (atomic_compare_exchange_weak(tat, &t, base + wall)) return;
    }
}

struct ticket {
    int dev;
    int measure;
    int64_t charged_ns;
    uint64_t key;
    CUcontext ctx;
    CUevent start, end;
};

/* Whether the driver has everything timing a launch needs (an old one may lack a variant). */
static int can_time(int ptsz) {
    return dl_cuda.cuEventCreate && dl_cuda.cuEventDestroy_v2 && dl_cuda.cuEventQuery && dl_cuda.cuCtxGetCurrent &&
           (ptsz ? dl_cuda.cuEventRecord_ptsz : dl_cuda.cuEventRecord) &&
           (dl_cuda.cuEventElapsedTime || dl_cuda.cuEventElapsedTime_v2);
}

static CUresult record(CUevent e, CUstream s, int ptsz) {
    return ptsz ? dl_cuda.cuEventRecord_ptsz(e, s) : dl_cuda.cuEventRecord(e, s);
}

static void before(struct ticket *t, uint64_t key, CUstream stream, int ptsz) {
    t->dev = -1;
    t->measure = 0;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    PFN_cuStreamIsCapturing_v10000 is_capturing = ptsz ? dl_cuda.cuStreamIsCapturing_ptsz : dl_cuda.cuStreamIsCapturing;
    if (!is_capturing || is_capturing(stream, &status) != CUDA_SUCCESS ||
        status != CU_STREAM_CAPTURE_STATUS_NONE)
        return;
    CUdevice d;
    if (!dl_cuda.cuCtxGetDevice || dl_cuda.cuCtxGetDevice(&d) != CUDA_SUCCESS) return;
    int dev = dl_device_for_ordinal((int)d, NULL);
    if (dev < 0) return;

    pthread_mutex_lock(&mu);
    if (!atomic_load(&captures)) poll_completed();
    t->key = key;
    int can_measure = ring_count < RING && can_time(ptsz) && dl_cuda.cuCtxGetCurrent(&t->ctx) == CUDA_SUCCESS && t->ctx;
    if (can_measure && get_event(t->ctx, &t->start) == 0) {
        if (get_event(t->ctx, &t->end) == 0) t->measure = 1;
        else put_event(t->ctx, t->start);
    }
    /* Fail open: a launch that cannot be timed while nothing has ever been timed in this process would be
     * charged the prior forever, never corrected - a throttle to PRIOR_NS per launch whatever the kernels
     * really take. Charge such launches nothing (other processes' charges on the clock still apply). */
    int cold = average_ns == 0;
    t->charged_ns = t->measure || !cold ? estimate(key) : 0;
    pthread_mutex_unlock(&mu);

    t->dev = dev;
    admit(dev, wall_cost(t->charged_ns));
    if (t->measure && record(t->start, stream, ptsz) != CUDA_SUCCESS) {
        dl_cuda.cuEventDestroy_v2(t->start);
        dl_cuda.cuEventDestroy_v2(t->end);
        t->measure = 0;
        if (cold) {
            atomic_fetch_sub(dl_region_tat(dev), wall_cost(t->charged_ns));
            t->charged_ns = 0;
        }
    }
}

static void after(struct ticket *t, CUresult r, CUstream stream, int ptsz) {
    if (t->dev < 0) return;
    if (r != CUDA_SUCCESS) {
        /* Nothing will run: refund the charge. */
        atomic_fetch_sub(dl_region_tat(t->dev), wall_cost(t->charged_ns));
        if (t->measure) {
            pthread_mutex_lock(&mu);
            put_event(t->ctx, t->start);
            put_event(t->ctx, t->end);
            pthread_mutex_unlock(&mu);
        }
        return;
    }
    if (!t->measure) return;
    if (record(t->end, stream, ptsz) != CUDA_SUCCESS) {
        dl_cuda.cuEventDestroy_v2(t->start);
        dl_cuda.cuEventDestroy_v2(t->end);
        return;
    }
    pthread_mutex_lock(&mu);
    if (ring_count < RING) {
        ring[(ring_head + ring_count) % RING] = (struct pending){t->ctx, t->start, t->end, t->key, t->dev, t->charged_ns};
        ring_count++;
    } else {
        put_event(t->ctx, t->start);
        put_event(t->ctx, t->end);
    }
    pthread_mutex_unlock(&mu);
}

#define THROTTLED(name, key, stream, ptsz, ...)                     \
    dl_cuda_init();                                                 \
    dl_core_init();                                                 \
    if (DL_UNLIKELY(!dl_cuda.name)) return CUDA_ERROR_NOT_FOUND;    \
    if (DL_LIKELY(!dl_throttle_on)) return dl_cuda.name(__VA_ARGS__); \
    struct ticket t;                                                \
    before(&t, key, stream, ptsz);                                  \
    CUresult r = dl_cuda.name(__VA_ARGS__);                         \
    after(&t, r, stream, ptsz);                                     \
    return r

#define BLOCKS(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

DL_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                                  void **extra) {
    THROTTLED(cuLaunchKernel, launch_key(f, BLOCKS(gx, gy, gz)), s, 0, f, gx, gy, gz, bx, by, bz, shm, s, params,
              extra);
}

DL_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                       CUstream s, void **params, void **extra) {
    THROTTLED(cuLaunchKernel_ptsz, launch_key(f, BLOCKS(gx, gy, gz)), s, 1, f, gx, gy, gz, bx, by, bz, shm, s,
              params, extra);
}

DL_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                             CUstream s, void **params) {
    THROTTLED(cuLaunchCooperativeKernel, launch_key(f, BLOCKS(gx, gy, gz)), s, 0, f, gx, gy, gz, bx, by, bz, shm,
              s, params);
}

DL_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz,
                                                  unsigned int shm, CUstream s, void **params) {
    THROTTLED(cuLaunchCooperativeKernel_ptsz, launch_key(f, BLOCKS(gx, gy, gz)), s, 1, f, gx, gy, gz, bx, by, bz,
              shm, s, params);
}

/* A NULL config is the driver's error to report; it is passed through unthrottled. */
#define EX_STREAM(c) ((c) ? (c)->hStream : NULL)
#define EX_KEY(c, f) launch_key(f, (c) ? BLOCKS((c)->gridDimX, (c)->gridDimY, (c)->gridDimZ) : 0)

DL_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    if (!config) {
        dl_cuda_init();
        return dl_cuda.cuLaunchKernelEx ? dl_cuda.cuLaunchKernelEx(config, f, params, extra) : CUDA_ERROR_NOT_FOUND;
    }
    THROTTLED(cuLaunchKernelEx, EX_KEY(config, f), EX_STREAM(config), 0, config, f, params, extra);
}

DL_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    if (!config) {
        dl_cuda_init();
        return dl_cuda.cuLaunchKernelEx_ptsz ? dl_cuda.cuLaunchKernelEx_ptsz(config, f, params, extra)
                                             : CUDA_ERROR_NOT_FOUND;
    }
    THROTTLED(cuLaunchKernelEx_ptsz, EX_KEY(config, f), EX_STREAM(config), 1, config, f, params, extra);
}

DL_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    THROTTLED(cuGraphLaunch, launch_key(g, 0), s, 0, g, s);
}

DL_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    THROTTLED(cuGraphLaunch_ptsz, launch_key(g, 0), s, 1, g, s);
}

/* ---- capture tracking (see the header comment) ---- */

static void capture_began(CUresult r) {
    if (r == CUDA_SUCCESS) atomic_fetch_add(&captures, 1);
}

static void capture_ended(CUresult r) {
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return;
    int c = atomic_load(&captures);
    while (c > 0 && !atomic_compare_exchange_weak(&captures, &c, c - 1)) {
    }
}

#define PASS(name, ...)                                          \
    dl_cuda_init();                                              \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND;              \
    CUresult r = dl_cuda.name(__VA_ARGS__)

DL_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    PASS(cuStreamBeginCapture_v2, s, mode);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    PASS(cuStreamBeginCapture_v2_ptsz, s, mode);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                               const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
    PASS(cuStreamBeginCaptureToGraph, s, g, deps, data, n, mode);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                    const CUgraphEdgeData *data, size_t n,
                                                    CUstreamCaptureMode mode) {
    PASS(cuStreamBeginCaptureToGraph_ptsz, s, g, deps, data, n, mode);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    PASS(cuStreamEndCapture, s, g);
    capture_ended(r);
    return r;
}

DL_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    PASS(cuStreamEndCapture_ptsz, s, g);
    capture_ended(r);
    return r;
}
