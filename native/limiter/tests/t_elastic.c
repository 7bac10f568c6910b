/*
 * One claim's process for the elastic compute tests (tests/t_elastic.sh lays out the agent's files and runs
 * several of these, each in a claim of its own). It launches kernels of one length on device 0 of the fake driver
 * and reports how busy its simulated GPU was.
 *
 *   t_elastic now                                 prints CLOCK_MONOTONIC in seconds
 *   t_elastic run <begin> <start> <end> <kernel us> [graph]
 *       launches from <begin> to <end> (CLOCK_MONOTONIC seconds) as fast as admission lets it (graph: each launch
 *       a graph of one kernel of that length); prints busy=<% of [start,end]> ran=<% of the part it had a CPU>
 *       and bins=<busy % of each 20 ms from begin>
 *   t_elastic duty <begin> <start> <end> <kernel us> <period us>
 *       a request every period: one kernel, then waits for it (latency-critical inference); prints busy and the
 *       p50/p99 of the requests' latency (launch to completion) in [start,end]
 *   t_elastic wake <begin> <period s> <on s> <count> <kernel us>
 *       a claim that wakes up count times, every period from begin, and launches for on seconds each time;
 *       prints wakes=<the time of each wake's first launch>
 * T_ELASTIC_BIN_MS: the bins' width (default 20 ms).
 */
#include "device.h"
#include "schedstat.h"
#include <time.h>
#include <unistd.h>

uint64_t fakecuda_busy_ns(int device);

#define SMS 132 /* run.sh: FAKE_CUDA_SM_COUNT=132, FAKE_CUDA_WAVE_NS=10000: one wave = 10 us */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t) {
    for (double n = now_s(); n < t; n = now_s()) {
        double d = t - n;
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Device 0 current, the image's "small" kernel in `fn` and a new stream in `s`. */
static void small_kernel(CUfunction *fn, CUstream *s) {
    CUmodule mod;
    use_device0();
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(fn, mod, "small"), CUDA_SUCCESS);
    CHECK_CU(cuStreamCreate(s, 0), CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2, "usage: t_elastic now | run ... | duty ...");
    if (strcmp(argv[1], "now") == 0) {
        printf("%.6f\n", now_s());
        return 0;
    }
    double BIN_S = getenv("T_ELASTIC_BIN_MS") ? atof(getenv("T_ELASTIC_BIN_MS")) / 1e3 : 0.02;
    if (strcmp(argv[1], "wake") == 0) {
        CHECK(argc == 7, "usage: t_elastic wake <begin> <period s> <on s> <count> <kernel us>");
        double begin = atof(argv[2]), period = atof(argv[3]), on = atof(argv[4]);
        int count = atoi(argv[5]);
        unsigned waves = (unsigned)atoi(argv[6]) / 10;
        CUfunction fn;
        CUstream s;
        small_kernel(&fn, &s);
        printf("wakes=");
        for (int k = 0; k < count; k++) {
            double w = begin + k * period;
            sleep_until(w);
            printf("%s%.6f", k ? "," : "", now_s());
            while (now_s() < w + on)
                CHECK_CU(cuLaunchKernel(fn, SMS * waves, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
        }
        printf("\n");
        return 0;
    }
    CHECK(argc >= 6, "usage: t_elastic run|duty <begin> <start> <end> <kernel us> [...]");
    double begin = atof(argv[2]), start = atof(argv[3]), end = atof(argv[4]);
    unsigned waves = (unsigned)atoi(argv[5]) / 10;
    int duty = strcmp(argv[1], "duty") == 0;
    int graph = argc > 6 && strcmp(argv[6], "graph") == 0;
    double period = duty && argc > 6 ? atof(argv[6]) / 1e6 : 0;
    CHECK(waves > 0 && end > start && start >= begin && (!duty || period > 0), "bad arguments");

    CUfunction fn;
    CUstream s;
    small_kernel(&fn, &s);
    CUgraphExec exec = NULL;
    if (graph) {
        CUgraph g;
        CHECK_CU(cuGraphCreate(&g, 0), CUDA_SUCCESS);
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = fn;
        p.gridDimX = SMS * waves;
        p.gridDimY = p.gridDimZ = p.blockDimY = p.blockDimZ = 1;
        p.blockDimX = 128;
        CUgraphNode node;
        CHECK_CU(cuGraphAddKernelNode_v2(&node, g, NULL, 0, &p), CUDA_SUCCESS);
        CHECK_CU(cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    }
    sleep_until(begin);

    static double bins[65536], lat[100000];
    int nbins = 0, nlat = 0;
    double next_bin = begin + BIN_S, next_req = begin;
    uint64_t bin0 = fakecuda_busy_ns(0), b0 = 0, d0 = 0;
    int measuring = 0;
    for (double t = now_s(); t < end; t = now_s()) {
        if (!measuring && t >= start) {
            measuring = 1;
            b0 = fakecuda_busy_ns(0);
            d0 = run_delay_ns();
        }
        while (t >= next_bin && nbins < 65536) {
            uint64_t b = fakecuda_busy_ns(0);
            bins[nbins++] = 100.0 * (double)(b - bin0) / (BIN_S * 1e9);
            bin0 = b;
            next_bin += BIN_S;
        }
        if (duty) {
            sleep_until(next_req);
            next_req += period;
            double t0 = now_s();
            CHECK_CU(cuLaunchKernel(fn, SMS * waves, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
            if (measuring && nlat < 100000) lat[nlat++] = now_s() - t0;
            continue;
        }
        if (graph) CHECK_CU(cuGraphLaunch(exec, s), CUDA_SUCCESS);
        else CHECK_CU(cuLaunchKernel(fn, SMS * waves, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    }
    uint64_t busy = fakecuda_busy_ns(0) - b0, delay = run_delay_ns() - d0;
    double window = (end - start) * 1e9, had_cpu = window - (double)delay;
    double drain = now_s();
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("busy=%.2f ran=%.2f queued_ms=%.1f", 100.0 * (double)busy / window,
           100.0 * (double)busy / (had_cpu > 1 ? had_cpu : 1), (now_s() - drain) * 1e3);
    if (duty && nlat) {
        qsort(lat, (size_t)nlat, sizeof lat[0], cmp);
        printf(" requests=%d p50_us=%.0f p99_us=%.0f", nlat, lat[nlat / 2] * 1e6, lat[nlat * 99 / 100] * 1e6);
    }
    printf(" bins=");
    for (int i = 0; i < nbins; i++) printf("%s%.0f", i ? "," : "", bins[i]);
    printf("\n");
    return 0;
}
