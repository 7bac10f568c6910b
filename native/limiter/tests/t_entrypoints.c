/*
 * Every launch entry point the driver API declares is throttled, on every route a program can take to it.
 * tests/check_launch_entrypoints.py lists them from the header (the toolkit's cuda.h where installed, else the
 * project's cuda_min.h) and runs this program with one argument per exported variant, name:base:version:pt:
 *
 *   t_entrypoints routes <name:base:version:pt>...
 *       dlsym (RTLD_DEFAULT, RTLD_NEXT, the driver's handle), cuGetProcAddress (4 arguments) and
 *       cuGetProcAddress_v2 (base name, version, stream flag) all give the limiter's wrapper of exactly that
 *       symbol; dlvsym (the driver's handle, RTLD_DEFAULT) gives nothing, or the wrapper - never the driver's own
 *       (glibc's dlvsym finds no unversioned symbol of an object with version tables, as libcuda is);
 *   t_entrypoints busy <cores%>
 *       the CUDA 2.0 launches (cuLaunch, cuLaunchGrid, cuLaunchGridAsync) and cuLaunchCooperativeKernelMultiDevice,
 *       each in a loop as fast as it goes: the simulated GPU is at most 3 points above the share.
 */
#define _GNU_SOURCE
#include "device.h"
#include "schedstat.h"
#include <time.h>

uint64_t fakecuda_busy_ns(int device);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void check_owner(const void *p, const char *route, const char *name) {
    const char *sym, *own = owner_of(p, &sym);
    CHECK(strcmp(own, "limiter") == 0 && strcmp(sym, name) == 0, "%s of %s gives %s in %s, not the limiter's wrapper",
          route, name, sym, own);
}

static void routes(int n, char **specs) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h, "dlopen: %s", dlerror());
    PFN_cuGetProcAddress_v11030 gpa4 = (PFN_cuGetProcAddress_v11030)dlsym(h, "cuGetProcAddress");
    PFN_cuGetProcAddress_v12000 gpa5 = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa4 && gpa5, "no cuGetProcAddress");
    CHECK_CU(gpa4("cuInit", &(void *){NULL}, 2000, 0), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        char name[128], base[128];
        int version, pt;
        CHECK(sscanf(specs[i], "%127[^:]:%127[^:]:%d:%d", name, base, &version, &pt) == 4, "bad spec %s", specs[i]);
        check_owner(dlsym(RTLD_DEFAULT, name), "dlsym(RTLD_DEFAULT)", name);
        check_owner(dlsym(RTLD_NEXT, name), "dlsym(RTLD_NEXT)", name);
        check_owner(dlsym(h, name), "dlsym(libcuda)", name);
        void *v = dlvsym(h, name, "libcuda.so.1");
        if (v) check_owner(v, "dlvsym(libcuda)", name);
        v = dlvsym(RTLD_DEFAULT, name, "libcuda.so.1");
        if (v) check_owner(v, "dlvsym(RTLD_DEFAULT)", name);
        cuuint64_t flags = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        void *p = NULL;
        CHECK_CU(gpa4(base, &p, version, flags), CUDA_SUCCESS);
        check_owner(p, "cuGetProcAddress", name);
        CUdriverProcAddressQueryResult st;
        p = NULL;
        CHECK_CU(gpa5(base, &p, version, flags, &st), CUDA_SUCCESS);
        check_owner(p, "cuGetProcAddress_v2", name);
        /* A program built against a newer toolkit asks with its own version: still the wrapper. */
        p = NULL;
        CHECK_CU(gpa5(base, &p, 13000, flags, &st), CUDA_SUCCESS);
        const char *sym, *own = owner_of(p, &sym);
        CHECK(strcmp(own, "limiter") == 0, "cuGetProcAddress_v2(%s, 13000) gives %s in %s", base, sym, own);
    }
    printf("t_entrypoints routes: %d launch entry points, each the limiter's on every route\n", n);
}

#define SMS 132 /* run.sh: one wave of 132 blocks is 10 us */

static void busy(int cores) {
    use_device0();
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "small"), CUDA_SUCCESS);
    CHECK_CU(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    static const char *names[] = {"cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync",
                                  "cuLaunchCooperativeKernelMultiDevice"};
    for (int k = 0; k < 4; k++) {
        double t0 = now_s(), start = t0 + 0.2, end = t0 + 0.8;
        uint64_t b0 = 0, d0 = 0;
        for (int measuring = 0;;) {
            double t = now_s();
            if (t >= end) break;
            if (!measuring && t >= start) measuring = 1, b0 = fakecuda_busy_ns(0), d0 = run_delay_ns();
            CUDA_LAUNCH_PARAMS lp = {.function = fn,
                                     .gridDimX = SMS * 5,
                                     .gridDimY = 1,
                                     .gridDimZ = 1,
                                     .blockDimX = 128,
                                     .blockDimY = 1,
                                     .blockDimZ = 1,
                                     .hStream = s};
            switch (k) {
                case 0: /* one block: a kernel of one wave (10 us) */
                    CHECK_CU(cuLaunch(fn), CUDA_SUCCESS);
                    break;
                case 1:
                    CHECK_CU(cuLaunchGrid(fn, SMS, 5), CUDA_SUCCESS);
                    break;
                case 2:
                    CHECK_CU(cuLaunchGridAsync(fn, SMS, 5, s), CUDA_SUCCESS);
                    break;
                default:
                    CHECK_CU(cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0), CUDA_SUCCESS);
                    break;
            }
        }
        double window = (end - start) * 1e9, b = 100.0 * (double)(fakecuda_busy_ns(0) - b0) / window;
        double ran = 100.0 * (double)(fakecuda_busy_ns(0) - b0) / (window - (double)(run_delay_ns() - d0));
        CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
        printf("  %s: busy %.2f%% (while running %.2f%%)\n", names[k], b, ran);
        CHECK(b <= cores + 3, "%s ran the GPU %.2f%% busy under a %d%% share", names[k], b, cores);
    }
    printf("t_entrypoints busy: the CUDA 2.0 and multi-device launches held to %d%%\n", cores);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2, "usage: t_entrypoints routes <name:base:version:pt>... | busy <cores%%>");
    if (strcmp(argv[1], "routes") == 0) routes(argc - 2, argv + 2);
    else if (strcmp(argv[1], "busy") == 0 && argc == 3) busy(atoi(argv[2]));
    else CHECK(0, "usage: t_entrypoints routes <name:base:version:pt>... | busy <cores%%>");
    return 0;
}
