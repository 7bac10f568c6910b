/*
 * Micro-benchmark: nanoseconds the limiter adds to cuLaunchKernel (no compute limit: the unthrottled
 * path) and to a cuMemAlloc_v2 + cuMemFree_v2 pair (memory limit set, shared region), against calling the
 * fake driver's own functions directly, in one process. Run with the limiter preloaded (bench/run.sh).
 * Kernels take no simulated time here (FAKE_CUDA_WAVE_NS=0), so only call overhead is measured.
 */
#define _GNU_SOURCE
#include "cuda_min.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *fakecuda_symbol(const char *name);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static const char *owner(const void *p) {
    Dl_info i;
    return dladdr(p, &i) && i.dli_fname ? (strstr(i.dli_fname, "libdragpu-limiter") ? "limiter" : "driver") : "?";
}

#define CK(call)                                                      \
    do {                                                              \
        CUresult r_ = (call);                                         \
        if (r_ != CUDA_SUCCESS) {                                     \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);       \
            exit(1);                                                  \
        }                                                             \
    } while (0)

static CUfunction fn;

static double launch_ns(PFN_cuLaunchKernel_v4000 launch, long n) {
    double t = now_ns();
    for (long i = 0; i < n; i++) CK(launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    return (now_ns() - t) / (double)n;
}

static double alloc_free_ns(PFN_cuMemAlloc_v3020 alloc, PFN_cuMemFree_v3020 release, long n) {
    CUdeviceptr p;
    double t = now_ns();
    for (long i = 0; i < n; i++) {
        CK(alloc(&p, 1 << 20));
        CK(release(p));
    }
    return (now_ns() - t) / (double)n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    int throttled = argc > 2 && strcmp(argv[2], "throttled") == 0; /* DRAGPU_CORES_LIMIT set by the caller */
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, "image"));
    CK(cuModuleGetFunction(&fn, mod, "k"));

    PFN_cuLaunchKernel_v4000 direct_launch = (PFN_cuLaunchKernel_v4000)fakecuda_symbol("cuLaunchKernel");
    PFN_cuMemAlloc_v3020 direct_alloc = (PFN_cuMemAlloc_v3020)fakecuda_symbol("cuMemAlloc_v2");
    PFN_cuMemFree_v3020 direct_free = (PFN_cuMemFree_v3020)fakecuda_symbol("cuMemFree_v2");
    PFN_cuLaunchKernel_v4000 lim_launch = cuLaunchKernel;
    PFN_cuMemAlloc_v3020 lim_alloc = cuMemAlloc_v2;
    PFN_cuMemFree_v3020 lim_free = cuMemFree_v2;
    if (strcmp(owner((void *)lim_launch), "limiter") || strcmp(owner((void *)direct_launch), "driver")) {
        fprintf(stderr, "run with the limiter preloaded (bench/run.sh)\n");
        return 1;
    }

    if (throttled) {
        /* Zero-length kernels never make the limiter wait: what remains is its bookkeeping per launch
         * (capture check, two timing events, polling completed ones). */
        double d = 1e18, l = 1e18;
        for (int round = 0; round < 5; round++) {
            double a = launch_ns(direct_launch, n / 20), b = launch_ns(lim_launch, n / 20);
            d = a < d ? a : d;
            l = b < l ? b : l;
        }
        printf("cuLaunchKernel (compute limit on):  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (bookkeeping, no wait)\n",
               d, l, l - d);
        return 0;
    }

    /* Interleaved rounds; the best round of each side counts (least disturbed by the rest of the machine). */
    double best[4] = {1e18, 1e18, 1e18, 1e18};
    for (int round = 0; round < 7; round++) {
        double v[4] = {launch_ns(direct_launch, n / 7), launch_ns(lim_launch, n / 7),
                       alloc_free_ns(direct_alloc, direct_free, n / 28), alloc_free_ns(lim_alloc, lim_free, n / 28)};
        for (int i = 0; i < 4; i++)
            if (v[i] < best[i]) best[i] = v[i];
    }
    printf("cuLaunchKernel (no compute limit):  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (goal < 50)\n",
           best[0], best[1], best[1] - best[0]);
    printf("cuMemAlloc_v2 + cuMemFree_v2 pair:  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (goal < 300)\n",
           best[2], best[3], best[3] - best[2]);
    return 0;
}
