/*
 * Stream capture: beginning and ending one, the interaction modes and which calls a capture prohibits (as the
 * real driver's record shows them, tests/real-gpu/h100-driver-facts.txt, checked by `t_capture record`), and
 * what a stream answers about its device and context while it captures.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdlib.h>

/* ---- capture interaction modes (cuThreadExchangeStreamCaptureMode, cuStreamBeginCapture_v2) ----
 * A thread whose own mode is not relaxed is prohibited from potentially unsafe calls when it has an open
 * capture of its own not begun in relaxed mode, or (its mode global) when another thread has one begun in
 * global mode. A prohibited call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 * captures that prohibited it: their cuStreamEndCapture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no
 * graph. Which calls are unsafe follows the real driver's record (tests/real-gpu/h100-driver-facts.txt,
 * checked by `t_capture record`): cuMemAlloc, cuCtxSynchronize, cuStreamQuery, cuStreamSynchronize,
 * cuEventQuery, cuEventSynchronize, cuMemPoolGetAttribute and cuMemPoolTrimTo; not cuMemGetInfo,
 * cuEventRecord, cuDeviceGetGraphMemAttribute, cuDeviceGraphMemTrim, cuCtxPush/PopCurrent or
 * cuPointerGetAttribute (of an ordinary allocation; of a captured one it was not measured, and the fake
 * allows it). A wait for the capturing stream itself (cuStreamQuery, cuStreamSynchronize of it,
 * cuCtxSynchronize of its context) invalidates it in every mode and from every thread. cuEventQuery of an
 * event last recorded into a capture returns CUDA_ERROR_INVALID_VALUE and invalidates nothing. */
#define MAX_OPEN_CAPTURES 64
static __thread CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static CUstream open_captures[MAX_OPEN_CAPTURES]; /* under mu */
static _Atomic int open_capture_count;

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    COUNT();
    CHECK(0);
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* Whether this thread may not make a potentially unsafe call now; if so, the captures that forbid it are
 * invalidated. Caller holds mu. */
static int unsafe_call_invalidates_locked(void) {
    if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
    int hit = 0;
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++) {
        CUstream c = open_captures[i];
        if (!c || c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        int mine = pthread_equal(c->owner, pthread_self());
        if (mine ||
            (thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            hit = 1;
        }
    }
    return hit;
}

int unsafe_call_invalidates(void) {
    if (!atomic_load(&open_capture_count)) return 0;
    pthread_mutex_lock(&mu);
    int hit = unsafe_call_invalidates_locked();
    pthread_mutex_unlock(&mu);
    return hit;
}

/* A wait for a device's streams (cuCtxSynchronize) while one of them captures: that capture is invalidated,
 * in every mode and from every thread. Whether there was one. */
int waiting_on_capture_invalidates(int device) {
    if (!atomic_load(&open_capture_count)) return 0;
    int hit = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++)
        if (open_captures[i] && open_captures[i]->device == device) {
            open_captures[i]->invalidated = 1;
            hit = 1;
        }
    pthread_mutex_unlock(&mu);
    return hit;
}

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    CHECK(!s);
    if (!st || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    *st = s && s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

TWINS(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus *st), return is_capturing(s, st);)

static CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
    CHECK(1);
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    if (s->magic != MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = MAGIC_GRAPH;
    pthread_mutex_lock(&mu);
    int slot = 0;
    while (slot < MAX_OPEN_CAPTURES && open_captures[slot]) slot++;
    if (slot == MAX_OPEN_CAPTURES) {
        pthread_mutex_unlock(&mu);
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->capture = g;
    s->capturing = 1;
    s->mode = mode;
    s->owner = pthread_self();
    s->invalidated = 0;
    open_captures[slot] = s;
    atomic_fetch_add(&open_capture_count, 1);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

TWINS(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), return begin_capture(s, mode);)

static CUresult end_capture(CUstream s, CUgraph *g) {
    CHECK(1);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (!s || s->magic != MAGIC_STREAM || !s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++)
        if (open_captures[i] == s) open_captures[i] = NULL;
    atomic_fetch_sub(&open_capture_count, 1);
    pthread_mutex_unlock(&mu);
    s->capturing = 0;
    if (s->invalidated) {
        free(s->capture);
        s->capture = NULL;
        *g = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

TWINS(cuStreamEndCapture, (CUstream s, CUgraph *g), return end_capture(s, g);)

/* ---- what a capturing stream answers about itself */

/* Asking a capturing stream for its device: the real H100 (driver 580) answers cuStreamGetDevice on a capturing
 * stream with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, in every mode and from any thread
 * (tests/real-gpu/h100-driver-facts.txt); every later call on that stream in the capture returns
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (the driver's own error log, CUDA_LOG_FILE). cuStreamGetCtx,
 * cuStreamIsCapturing and cuCtxGetDevice are allowed. Whether the call fails; CUDA_SUCCESS when it may go on. */
static CUresult stream_query_in_capture(CUstream s) {
    if (!s || !s->capturing) return CUDA_SUCCESS;
    if (s->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    s->invalidated = 1;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* What a call that is allowed during capture gets on a capture already invalidated. */
static CUresult stream_in_invalid_capture(CUstream s) {
    return s && s->capturing && s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

static CUresult stream_get_device(CUstream s, CUdevice *d) {
    CHECK(0);
    if (!d || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    CUresult c = stream_query_in_capture(s);
    if (c != CUDA_SUCCESS) return c;
    if (!s && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    *d = stream_device(s);
    return CUDA_SUCCESS;
}

static CUresult stream_get_ctx(CUstream s, CUcontext *c) {
    CHECK(!s);
    if (!c || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    CUresult q = stream_in_invalid_capture(s);
    if (q != CUDA_SUCCESS) return q;
    *c = s ? s->ctx : current();
    return CUDA_SUCCESS;
}

TWINS(cuStreamGetCtx, (CUstream s, CUcontext *c), return stream_get_ctx(s, c);)

TWINS(cuStreamGetDevice, (CUstream s, CUdevice *d), return stream_get_device(s, d);)
