/*
 * The driver's entry points that begin and end a stream capture: they keep capture.c's count of the captures open
 * in the process, and the end of one hands its graph allocations to the graph it produced (pools.c).
 */
#define _GNU_SOURCE
#include "capture.h"
#include "common.h"
#include "driver.h"
#include "pools.h"

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
