/*
 * Stream capture, as the compute limiter must see it.
 *
 * Launches recorded into a capturing stream are not executed then: they are neither charged nor measured (the
 * graph is charged when launched, by measuring cuGraphLaunch), and the stream is asked nothing but whether it
 * captures (the real driver invalidates a capture whose stream is asked for its device). Every way to begin a
 * capture is wrapped, so that a process with none open (the count below is zero) asks nothing at all. While
 * any stream of the process is capturing, the library's own driver calls run with this thread's capture mode
 * relaxed (cuThreadExchangeStreamCaptureMode), so that they cannot invalidate a global-mode capture; only a
 * driver without that call makes measurements wait until the capture ends.
 */
#define _GNU_SOURCE
#include "capture.h"
#include "common.h"
#include "driver.h"
#include "pools.h"

_Atomic int dl_captures;

void dl_capture_reset_after_fork(void) { atomic_store(&dl_captures, 0); }

int dl_capture_relax(void) {
    if (DL_LIKELY(!atomic_load_explicit(&dl_captures, memory_order_relaxed))) return -1;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!dl_cuda.cuThreadExchangeStreamCaptureMode || dl_cuda.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return -1;
    return (int)mode;
}

void dl_capture_restore(int saved) {
    if (saved < 0) return;
    CUstreamCaptureMode mode = (CUstreamCaptureMode)saved;
    dl_cuda.cuThreadExchangeStreamCaptureMode(&mode);
}

int dl_captures_open(void) { return atomic_load_explicit(&dl_captures, memory_order_relaxed) != 0; }

int dl_stream_capture_status(CUstream s, int ptsz) {
    PFN_cuStreamIsCapturing_v10000 f = ptsz ? dl_cuda.cuStreamIsCapturing_ptsz : dl_cuda.cuStreamIsCapturing;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!f || f(s, &st) != CUDA_SUCCESS) return -1;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void capture_began(CUresult r) {
    if (r == CUDA_SUCCESS) atomic_fetch_add(&dl_captures, 1);
}

static void capture_ended(CUresult r) {
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return;
    int c = atomic_load(&dl_captures);
    while (c > 0 && !atomic_compare_exchange_weak(&dl_captures, &c, c - 1)) {}
}

#define PASS(name, ...)                                                                                                \
    dl_cuda_init();                                                                                                    \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND;                                                                    \
    CUresult r = dl_cuda.name(__VA_ARGS__)

DL_EXPORT CUresult cuStreamBeginCapture(CUstream s) {
    PASS(cuStreamBeginCapture, s);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    PASS(cuStreamBeginCapture_ptsz, s);
    capture_began(r);
    return r;
}

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
                                                    const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
    PASS(cuStreamBeginCaptureToGraph_ptsz, s, g, deps, data, n, mode);
    capture_began(r);
    return r;
}

DL_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    PASS(cuStreamEndCapture, s, g);
    capture_ended(r);
    dl_graphmem_capture_ended(s, r == CUDA_SUCCESS && g ? *g : NULL);
    return r;
}

DL_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    PASS(cuStreamEndCapture_ptsz, s, g);
    capture_ended(r);
    dl_graphmem_capture_ended(s, r == CUDA_SUCCESS && g ? *g : NULL);
    return r;
}
