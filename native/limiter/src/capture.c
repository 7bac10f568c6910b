/*
 * Stream capture, as the compute limiter must see it.
 *
 * Launches recorded into a capturing stream are not executed then: they are neither charged nor measured (the
 * graph is charged when launched, by measuring cuGraphLaunch), and the stream is asked nothing but whether it
 * captures (the real driver invalidates a capture whose stream is asked for its device). Every way to begin a
 * capture is wrapped, so that a process with none open (the count below is zero) asks nothing at all. While
 * any stream of the process is capturing, the library's own driver calls run with this thread's capture mode
 * relaxed (cuThreadExchangeStreamCaptureMode), so that they cannot invalidate a global-mode capture; only a
 * driver without that call makes measurements wait until the capture ends. The wrappers that begin and end
 * captures, and count them, are capture_calls.c's.
 */
#define _GNU_SOURCE
#include "capture.h"
#include "fork.h"
#include "common.h"
#include "driver.h"

_Atomic int dl_captures;

static void dl_capture_reset_after_fork(void) { atomic_store(&dl_captures, 0); }
DL_FORK_HANDLERS(DL_FORK_CAPTURE, NULL, NULL, dl_capture_reset_after_fork);

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
