/*
 * Simulated execution: modules and libraries, kernel launches (every family and ABI), streams and events.
 * Kernels take simulated time: launches return at once and queue on the device (all streams of a device run
 * one after another), a launch blocks when 1024 are queued, events complete when the work queued before them
 * has, and synchronisation sleeps until the device is idle. A kernel of B blocks runs ceil(B / SMs) waves of
 * FAKE_CUDA_WAVE_NS each. A launch on a capturing stream is recorded into the capture's graph instead.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct CUevent_st {
    unsigned magic;
    int device;
    int recorded;
    uint64_t ts;
    struct CUctx_st *ctx;
    unsigned gen;
    int captured; /* last recorded into a capturing stream: a node of a graph, not a time */
};
struct CUmod_st {
    unsigned magic;
};
struct CUfunc_st {
    unsigned magic;
    char name[64];
};

/* ---------------------------------------------------------------- simulated execution */

static void sleep_until(uint64_t t) {
    uint64_t now = now_ns();
    if (t <= now) return;
    struct timespec ts = {.tv_sec = (time_t)((t - now) / 1000000000ull), .tv_nsec = (long)((t - now) % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

/* The real driver's timing (580, H100 and H200), as driver-facts.cu and bracket-facts.cu measured it:
 * tests/real-gpu/h100-driver-facts.txt (`timing.*`) and h200-bracket-facts.txt. With FAKE_CUDA_REAL_TIMING=1 the
 * fake follows them; otherwise a kernel starts the moment the device is free and calls take no time.
 *   - a kernel on an idle device starts LATENCY_IDLE_NS after its launch call returns (which takes the host
 *     HOST_LAUNCH_NS): events around it hold the launch's host time, 1931 ns and the kernel
 *     (bracket.idle.extra_ns);
 *   - a kernel queued behind another starts LATENCY_QUEUED_NS after it ends
 *     (timing.queued_50us_kernel_overhead_ns: ten kernels in one bracket, 2128 ns each);
 *   - an event recorded on an idle device is stamped when its record returns (two back to back measure
 *     the record's host time); one recorded behind work is stamped when that work ends and holds the device
 *     EVENT_QUEUED_NS: a bracket around each of a queue of kernels holds 2816 ns besides the kernel
 *     (bracket.queued.extra_ns), 688 more than a kernel queued without events;
 *   - event timestamps are multiples of EVENT_TICK_NS (timing.back_to_back_events_ns: 1280 and 1248);
 *   - the calling thread spends HOST_LAUNCH_NS in a launch, HOST_EVENT_RECORD_NS in cuEventRecord and
 *     HOST_EVENT_QUERY_NS in cuEventQuery (timing.launch_host_ns, event_record_host_ns,
 *     event_query_*_host_ns).
 * Busy time (fakecuda_busy_ns) is the kernels' own time: latencies are not in it. */
#define LATENCY_IDLE_NS 1930ull
#define LATENCY_QUEUED_NS 2128ull
#define EVENT_QUEUED_NS 688ull
#define EVENT_TICK_NS 32ull
#define HOST_LAUNCH_NS 4070ull
#define HOST_EVENT_RECORD_NS 1225ull
#define HOST_EVENT_QUERY_NS 280ull

/* Another process's context on the device (FAKE_CUDA_NEIGHBOUR_BUSY_US=b, FAKE_CUDA_NEIGHBOUR_FREE_US=f): it holds
 * the device for b us out of every b + f us, on the monotonic clock. A start event recorded onto an idle device
 * within such a window is reached only when the window ends, and what is queued behind it runs after it: the
 * real driver's behaviour with two contexts time-sliced (tests/real-gpu/bracket-facts.cu). Work already under way
 * is not preempted, and launches without an event before them are not held back (only brackets are compared
 * with the kernels they hold). */
static uint64_t after_neighbour(uint64_t t) {
    if (!G.neighbour_period_ns) return t;
    uint64_t in = t % G.neighbour_period_ns;
    return in < G.neighbour_busy_ns ? t - in + G.neighbour_busy_ns : t;
}

static void host_cost(uint64_t ns) {
    if (!G.real_timing) return;
    uint64_t until = now_ns() + ns;
    while (now_ns() < until) {}
}

uint64_t kernel_ns(uint64_t blocks) {
    if (blocks == 0) blocks = 1;
    return (blocks + G.sms - 1) / G.sms * G.wave_ns;
}

/* A kernel's time: its waves, or for a function named "spin" the nanoseconds its first parameter (a uint64_t)
 * says - as a real kernel's time depends on its data, which neither the grid nor the function tells. */
static uint64_t launch_ns(CUfunction f, uint64_t blocks, void **params) {
    if (strcmp(f->name, "spin") == 0 && params && params[0]) return *(const uint64_t *)params[0];
    return kernel_ns(blocks);
}

/* Queues work of the given duration on a device; blocks while QUEUE_DEPTH launches are pending. */
void enqueue(int device, uint64_t duration) {
    struct device *d = &devices[device];
    pthread_mutex_lock(&mu);
    uint64_t oldest = d->queue_end[d->queue_pos];
    while (oldest > now_ns()) {
        pthread_mutex_unlock(&mu);
        sleep_until(oldest);
        pthread_mutex_lock(&mu);
        oldest = d->queue_end[d->queue_pos];
    }
    uint64_t now = now_ns();
    uint64_t start = d->busy_until > now ? d->busy_until : now;
    if (G.real_timing) start += d->busy_until > now ? LATENCY_QUEUED_NS : LATENCY_IDLE_NS;
    d->busy_until = start + duration;
    d->busy_total += duration;
    d->queue_start[d->queue_pos] = start;
    d->queue_end[d->queue_pos] = d->busy_until;
    d->queue_pos = (d->queue_pos + 1) % QUEUE_DEPTH;
    pthread_mutex_unlock(&mu);
}

void wait_idle(int device) {
    pthread_mutex_lock(&mu);
    uint64_t t = devices[device].busy_until;
    pthread_mutex_unlock(&mu);
    sleep_until(t);
}

/* A launch: executed, or recorded into the capturing stream's graph. */
/* A launch on a stream needs no current context (the stream has one; a CUkernel is context-less). */
static CUresult launch(CUfunction f, uint64_t blocks, void **params, CUstream s) {
    CHECK(!s);
    if (!f || f->magic != MAGIC_FUNC || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t duration = launch_ns(f, blocks, params);
    host_cost(HOST_LAUNCH_NS);
    if (s && s->capturing) {
        s->capture->duration_ns += duration;
        s->capture->nodes++;
        return CUDA_SUCCESS;
    }
    enqueue(s ? s->device : cur_device(), duration);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- modules and launches */

/* A kernel named `name`: what a module's cuModuleGetFunction and a library's cuLibraryGetKernel give out. */
static struct CUfunc_st *new_function(const char *name) {
    struct CUfunc_st *fn = calloc(1, sizeof *fn);
    if (!fn) return NULL;
    fn->magic = MAGIC_FUNC;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    return fn;
}

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    COUNT();
    CHECK(1);
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    mod->magic = MAGIC_MOD;
    *m = mod;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    COUNT();
    CHECK(1);
    if (!f || !m || m->magic != MAGIC_MOD || !name) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *fn = new_function(name);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    *f = fn;
    return CUDA_SUCCESS;
}

/* Libraries are context-independent: their kernels (CUkernel) launch through cuLaunchKernel* in whatever
 * context the launch's stream has. */
struct CUlib_st {
    unsigned magic;
};
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
                                  CUlibraryOption *lo, void **lv, unsigned int nl) {
    COUNT();
    CHECK(0);
    (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
    if (!lib || !code) return CUDA_ERROR_INVALID_VALUE;
    struct CUlib_st *l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = MAGIC_MOD;
    *lib = l;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) {
    COUNT();
    CHECK(0);
    if (!k || !lib || lib->magic != MAGIC_MOD || !name) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *fn = new_function(name);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    *k = (CUkernel)fn;
    return CUDA_SUCCESS;
}

TWINS(cuLaunchKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
       CUstream s, void **params, void **extra),
      (void)bx, (void)by, (void)bz, (void)shm, (void)extra;
      return launch(f, GRID(gx, gy, gz), params, s);)

TWINS(cuLaunchCooperativeKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
       CUstream s, void **params),
      (void)bx, (void)by, (void)bz, (void)shm;
      return launch(f, GRID(gx, gy, gz), params, s);)

TWINS(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (void)extra;
      if (!c) return CUDA_ERROR_INVALID_VALUE;
      return launch(f, GRID(c->gridDimX, c->gridDimY, c->gridDimZ), params, c->hStream);)

/* The CUDA 2.0 launches (deprecated, still declared by cuda.h): a grid of width x height blocks, cuLaunch one block,
 * on the legacy default stream unless given one. */
EXPORT CUresult cuLaunch(CUfunction f) {
    COUNT();
    return launch(f, 1, NULL, NULL);
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
    COUNT();
    if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, GRID(w, h, 1), NULL, NULL);
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    COUNT();
    if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, GRID(w, h, 1), NULL, s);
}

/* One kernel per entry, each on its own stream (deprecated since CUDA 11.3, still declared). */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned flags) {
    COUNT();
    (void)flags;
    if (!l || n == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult r =
            launch(l[i].function, GRID(l[i].gridDimX, l[i].gridDimY, l[i].gridDimZ), l[i].kernelParams, l[i].hStream);
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- streams (their capture: capture.c) */

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = calloc(1, sizeof *st);
    if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
    *st = (struct CUstream_st){.magic = MAGIC_STREAM, .device = cur_device(), .ctx = current()};
    *s = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    COUNT();
    CHECK(0);
    if (!s || s->magic != MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s) {
    CHECK(1);
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->capturing) { /* its work is not scheduled: the capture is invalid from now on */
        s->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_idle(stream_device(s));
    release_pools_of(stream_device(s));
    return CUDA_SUCCESS;
}

/* Not in cuda_min.h: the library does not call it; applications (and the record's test) do. */
EXPORT CUresult cuStreamQuery(CUstream s);
EXPORT CUresult cuStreamQuery(CUstream s) {
    COUNT();
    CHECK(1);
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->capturing) { /* asks whether captured work ran: the capture is invalid, in every mode */
        s->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    int busy = devices[stream_device(s)].busy_until > now_ns();
    pthread_mutex_unlock(&mu);
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

TWINS(cuStreamSynchronize, (CUstream s), return stream_sync(s);)

/* ---------------------------------------------------------------- events */

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (G.event_create_fails) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *ctx = current();
    *ev = (struct CUevent_st){MAGIC_EVENT, cur_device(), 0, 0, ctx, ctx ? ctx->gen : 0, 0};
    *e = ev;
    return CUDA_SUCCESS;
}

_Atomic unsigned long stale_event_uses; /* fakecuda_stale_event_uses */
static int stale(CUevent e) {
    if (!e->ctx || e->gen == e->ctx->gen) return 0;
    stale_event_uses++;
    return 1;
}

/* Recording an event needs a current context, even on a stream that names its own (as the real driver). */
static CUresult event_record(CUevent e, CUstream s) {
    CHECK(1);
    if (!e || e->magic != MAGIC_EVENT || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (e->device != stream_device(s)) return CUDA_ERROR_INVALID_HANDLE; /* another context's event */
    if (stale(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (s && s->capturing) { /* an event node of the graph being built; the event has no time until re-recorded */
        e->captured = 1;
        e->recorded = 0;
        return CUDA_SUCCESS;
    }
    e->captured = 0;
    host_cost(HOST_EVENT_RECORD_NS);
    pthread_mutex_lock(&mu);
    uint64_t now = now_ns(), busy = devices[stream_device(s)].busy_until;
    e->ts = busy > now ? busy : after_neighbour(now); /* reached after our work, or the neighbour's */
    if (e->ts > now) devices[stream_device(s)].busy_until = e->ts + (G.real_timing ? EVENT_QUEUED_NS : 0);
    if (G.real_timing) e->ts = (e->ts + EVENT_TICK_NS - 1) / EVENT_TICK_NS * EVENT_TICK_NS;
    e->recorded = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

TWINS(cuEventRecord, (CUevent e, CUstream s), return event_record(e, s);)

EXPORT CUresult cuEventQuery(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (stale(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (e->captured) return CUDA_ERROR_INVALID_VALUE; /* the record: checked first, invalidates nothing */
    host_cost(HOST_EVENT_QUERY_NS);
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return !e->recorded || e->ts <= now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (e->recorded) sleep_until(e->ts);
    release_pools_of(e->device);
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b) {
    CHECK(0);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != MAGIC_EVENT || b->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (stale(a) || stale(b)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = now_ns();
    if (a->ts > now || b->ts > now) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->ts - (double)a->ts) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    COUNT();
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    COUNT();
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}
