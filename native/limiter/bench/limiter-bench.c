/*
 * Micro-benchmark: nanoseconds the limiter adds to cuLaunchKernel (no compute limit: the unthrottled
 * path; or, with "throttled", a compute limit whose clock never makes the launch wait: the bookkeeping),
 * and to a cuMemAlloc_v2 + cuMemFree_v2 pair (memory limit set, shared region), against calling the fake
 * driver's own functions directly, in one process. Run with the limiter preloaded (bench/run.sh). Kernels
 * take no simulated time here (FAKE_CUDA_WAVE_NS=0), so only call overhead is measured; "throttled spread"
 * launches one kernel and grid of 1 and 3 us in turn instead, a kind the limiter times on every launch.
 *
 * Rounds of both sides alternate; each figure is the median over the rounds (ns per call), and "added" the
 * median of the per-round differences.
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

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                                        \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static CUfunction fn, spin;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[64];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static double launch_ns(PFN_cuLaunchKernel_v4000 launch, long n) {
    double t = now_ns();
    for (long i = 0; i < n; i++) CK(launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    return (now_ns() - t) / (double)n;
}

/* One kernel and grid whose runs take 1 or 3 us in turn (the fake's "spin" runs for its argument's ns), as a
 * GEMM of one grid over different depths does: its times spread, so the limiter times every launch. */
static double spread_launch_ns(PFN_cuLaunchKernel_v4000 launch, long n) {
    uint64_t dur;
    void *params[] = {&dur};
    double t = now_ns();
    for (long i = 0; i < n; i++) {
        dur = i & 1 ? 3000 : 1000;
        CK(launch(spin, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    }
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
    int spread = throttled && argc > 3 && strcmp(argv[3], "spread") == 0;
    double (*throttled_launch_ns)(PFN_cuLaunchKernel_v4000, long) = spread ? spread_launch_ns : launch_ns;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, "image"));
    CK(cuModuleGetFunction(&fn, mod, "k"));
    CK(cuModuleGetFunction(&spin, mod, "spin"));

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

    enum { ROUNDS = 21 };
    double v[4][ROUNDS], diff[2][ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        if (throttled) {
            v[0][round] = throttled_launch_ns(direct_launch, n / ROUNDS / 4);
            v[1][round] = throttled_launch_ns(lim_launch, n / ROUNDS / 4);
        } else {
            v[0][round] = launch_ns(direct_launch, n / ROUNDS);
            v[1][round] = launch_ns(lim_launch, n / ROUNDS);
            v[2][round] = alloc_free_ns(direct_alloc, direct_free, n / ROUNDS / 4);
            v[3][round] = alloc_free_ns(lim_alloc, lim_free, n / ROUNDS / 4);
        }
        diff[0][round] = v[1][round] - v[0][round];
        diff[1][round] = v[3][round] - v[2][round];
    }
    if (throttled) {
        const char *real = getenv("FAKE_CUDA_REAL_TIMING");
        const char *why = spread ? "the same, a kind whose times spread: every launch timed"
                          : real && strcmp(real, "1") == 0
                              ? "the real driver's host costs: launch, event record and query"
                              : "goal < 200; bookkeeping, no wait";
        printf("cuLaunchKernel (compute limit on):  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (%s)\n",
               median(v[0], ROUNDS), median(v[1], ROUNDS), median(diff[0], ROUNDS), why);
        return 0;
    }
    printf("cuLaunchKernel (no compute limit):  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (goal < 10)\n",
           median(v[0], ROUNDS), median(v[1], ROUNDS), median(diff[0], ROUNDS));
    printf("cuMemAlloc_v2 + cuMemFree_v2 pair:  driver %7.1f ns  with limiter %7.1f ns  added %6.1f ns  (goal < 150)\n",
           median(v[2], ROUNDS), median(v[3], ROUNDS), median(diff[1], ROUNDS));
    return 0;
}
