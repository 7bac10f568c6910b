/*
 * The launch entry points: every launch and graph-launch call of the driver API is throttled (measure.c,
 * admission.c). The unthrottled path (cores unset or 100) is one predictable branch: no lock, no system call.
 */
#include "admission.h"
#include "common.h"
#include "driver.h"
#include "init.h"
#include "measure.h"
#include "pools.h"

#define THROTTLED(name, key, stream, ptsz, ...)                                                                        \
    dl_cuda_init();                                                                                                    \
    dl_core_init();                                                                                                    \
    if (DL_UNLIKELY(!dl_cuda.name)) return CUDA_ERROR_NOT_FOUND;                                                       \
    if (DL_LIKELY(!dl_throttle_on)) return dl_cuda.name(__VA_ARGS__);                                                  \
    struct dl_ticket t;                                                                                                \
    dl_ticket_open(&t, key, stream, ptsz);                                                                             \
    CUresult r = dl_cuda.name(__VA_ARGS__);                                                                            \
    dl_ticket_close(&t, r, stream, ptsz);                                                                              \
    return r

#define BLOCKS(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

DL_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                                  void **extra) {
    THROTTLED(cuLaunchKernel, dl_launch_key(f, BLOCKS(gx, gy, gz)), s, 0, f, gx, gy, gz, bx, by, bz, shm, s, params,
              extra);
}

DL_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                       unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                                       void **extra) {
    THROTTLED(cuLaunchKernel_ptsz, dl_launch_key(f, BLOCKS(gx, gy, gz)), s, 1, f, gx, gy, gz, bx, by, bz, shm, s,
              params, extra);
}

DL_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                             CUstream s, void **params) {
    THROTTLED(cuLaunchCooperativeKernel, dl_launch_key(f, BLOCKS(gx, gy, gz)), s, 0, f, gx, gy, gz, bx, by, bz, shm, s,
              params);
}

DL_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                                  CUstream s, void **params) {
    THROTTLED(cuLaunchCooperativeKernel_ptsz, dl_launch_key(f, BLOCKS(gx, gy, gz)), s, 1, f, gx, gy, gz, bx, by, bz,
              shm, s, params);
}

/* A NULL config is the driver's error to report; it is passed through unthrottled. */
#define EX_STREAM(c) ((c) ? (c)->hStream : NULL)
#define EX_KEY(c, f) dl_launch_key(f, (c) ? BLOCKS((c)->gridDimX, (c)->gridDimY, (c)->gridDimZ) : 0)

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

/* The CUDA 2.0 launches, deprecated but still declared and exported by the driver: a grid of width x height blocks
 * (cuLaunch: one) on the legacy default stream, or the given one. */
DL_EXPORT CUresult cuLaunch(CUfunction f) { THROTTLED(cuLaunch, dl_launch_key(f, 1), NULL, 0, f); }

DL_EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
    THROTTLED(cuLaunchGrid, dl_launch_key(f, BLOCKS(w, h, 1)), NULL, 0, f, w, h);
}

DL_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    THROTTLED(cuLaunchGridAsync, dl_launch_key(f, BLOCKS(w, h, 1)), s, 0, f, w, h, s);
}

/* One kernel per entry, each on its own stream and device (deprecated since CUDA 11.3): each is charged and
 * admitted as a launch of its own; more entries than devices are the driver's error to report. */
DL_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned int n, unsigned int flags) {
    dl_cuda_init();
    dl_core_init();
    if (DL_UNLIKELY(!dl_cuda.cuLaunchCooperativeKernelMultiDevice)) return CUDA_ERROR_NOT_FOUND;
    if (DL_LIKELY(!dl_throttle_on) || !l || n == 0 || n > DL_MAX_DEVICES)
        return dl_cuda.cuLaunchCooperativeKernelMultiDevice(l, n, flags);
    struct dl_ticket t[DL_MAX_DEVICES];
    for (unsigned i = 0; i < n; i++)
        dl_ticket_open(&t[i], dl_launch_key(l[i].function, BLOCKS(l[i].gridDimX, l[i].gridDimY, l[i].gridDimZ)),
                       l[i].hStream, 0);
    CUresult r = dl_cuda.cuLaunchCooperativeKernelMultiDevice(l, n, flags);
    for (unsigned i = 0; i < n; i++) dl_ticket_close(&t[i], r, l[i].hStream, 0);
    return r;
}

/* A graph's first launch also charges its memory allocations (pools.c); the check is one relaxed load. */
static CUresult graph_launch(CUgraphExec g, CUstream s, int ptsz) {
    PFN_cuGraphLaunch_v10000 call = ptsz ? dl_cuda.cuGraphLaunch_ptsz : dl_cuda.cuGraphLaunch;
    struct dl_graph_ticket gt = {.n = 0};
    if (atomic_load_explicit(&dl_graphmem_pending, memory_order_relaxed)) {
        CUresult a = dl_graphmem_before_launch(g, &gt);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r;
    if (!dl_throttle_on) {
        r = call(g, s);
    } else {
        struct dl_ticket t;
        dl_ticket_open(&t, dl_launch_key(g, 0), s, ptsz);
        r = call(g, s);
        dl_ticket_close(&t, r, s, ptsz);
    }
    dl_graphmem_after_launch(g, r, &gt);
    return r;
}

DL_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    dl_cuda_init();
    dl_core_init();
    if (DL_UNLIKELY(!dl_cuda.cuGraphLaunch)) return CUDA_ERROR_NOT_FOUND;
    if (DL_UNLIKELY(atomic_load_explicit(&dl_graphmem_pending, memory_order_relaxed))) return graph_launch(g, s, 0);
    if (DL_LIKELY(!dl_throttle_on)) return dl_cuda.cuGraphLaunch(g, s);
    return graph_launch(g, s, 0);
}

DL_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    dl_cuda_init();
    dl_core_init();
    if (DL_UNLIKELY(!dl_cuda.cuGraphLaunch_ptsz)) return CUDA_ERROR_NOT_FOUND;
    if (DL_UNLIKELY(atomic_load_explicit(&dl_graphmem_pending, memory_order_relaxed))) return graph_launch(g, s, 1);
    if (DL_LIKELY(!dl_throttle_on)) return dl_cuda.cuGraphLaunch_ptsz(g, s);
    return graph_launch(g, s, 1);
}
