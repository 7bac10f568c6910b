// What a pair of timing events around one kernel holds besides the kernel, on the real driver: the facts the
// compute cap's charge (measure.c, kernel_time()) is built on. Printed as `key=value` lines.
//
// Build and run on a GPU node (no limiter preloaded):
//   nvcc -O2 -o bracket-facts bracket-facts.cu -lcuda   (beside facts.h) && ./bracket-facts > bracket-facts.txt
//
// Every launch is a 50 us spin that writes its own start and end (the GPU's global timer), so each bracket is
// compared with the kernel as the GPU ran it:
//   bracket.<case>.extra_ns         bracket - kernel - host time from the start event's record to the launch's
//                                   return (what kernel_time() takes off as the launch gap)
//   bracket.<case>.gross_ns         bracket - kernel
//   bracket.<case>.record_host_ns   the start event's record, host time (how much of it a bracket may hold:
//                                   extra_ns beyond the device's gap)
//   bracket.<case>.start_done       of the launches, how many found their start event complete when the launch
//                                   returned (cuEventQuery)
// Cases: idle (the GPU had nothing queued), queued (10 back to back), both again with a block on every SM
// (full.*), and with one block while another process keeps the GPU busy with its own context
// (neighbour_busy: back-to-back 50 us kernels; neighbour_paced: one every 100 us). full.graph: a CUDA graph of
// 20 kernels of 100 us, its bracket against the time it held the GPU (its "kernel" here), and
// graph.full.graph.node_gap_ns, the GPU's gaps between its nodes.
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "facts.h"

static void pause_ns(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Each block spins `ns` and writes its own start and end: the kernel ran from the first start to the last end. */
__global__ void spin(long long ns, unsigned long long *out) {
    unsigned long long start, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    t = start;
    while ((long long)(t - start) < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (out) {
        out[2 * blockIdx.x] = start;
        out[2 * blockIdx.x + 1] = t;
    }
}

enum { N = 400, QUEUE = 10 };

struct sample {
    double bracket, kernel, host, record; /* record: the start event's cuEventRecord, host time */
    int start_done;
};

static void report(const char *name, struct sample *s, int n) {
    static double v[N * QUEUE], w[N * QUEUE];
    int done = 0, nd = 0, np = 0;
    static double vd[N * QUEUE], vp[N * QUEUE];
    for (int i = 0; i < n; i++) {
        v[i] = s[i].bracket - s[i].kernel - s[i].host;
        w[i] = s[i].kernel;
        if (s[i].start_done) {
            done++;
            vd[nd++] = v[i];
        } else {
            vp[np++] = v[i];
        }
    }
    static double g[N * QUEUE];
    for (int i = 0; i < n; i++) g[i] = s[i].bracket - s[i].kernel;
    qsort(g, n, sizeof g[0], cmp_d);
    printf("bracket.%s.gross_ns median=%.0f p10=%.0f p90=%.0f\n", name, g[n / 2], g[n / 10], g[9 * n / 10]);
    qsort(v, n, sizeof v[0], cmp_d);
    qsort(w, n, sizeof w[0], cmp_d);
    qsort(vd, nd, sizeof vd[0], cmp_d);
    qsort(vp, np, sizeof vp[0], cmp_d);
    double mean = 0, rec = 0;
    for (int i = 0; i < n; i++) {
        mean += v[i];
        rec += s[i].record;
    }
    printf("bracket.%s.record_host_ns mean=%.0f\n", name, rec / n);
    printf("bracket.%s.extra_ns median=%.0f p10=%.0f p90=%.0f mean=%.0f\n", name, v[n / 2], v[n / 10],
           v[9 * n / 10], mean / n);
    printf("bracket.%s.kernel_ns median=%.0f\n", name, w[n / 2]);
    printf("bracket.%s.start_done=%d/%d\n", name, done, n);
    if (nd) printf("bracket.%s.extra_ns.start_done median=%.0f p10=%.0f p90=%.0f\n", name, vd[nd / 2], vd[nd / 10], vd[9 * nd / 10]);
    if (np) printf("bracket.%s.extra_ns.start_pending median=%.0f p10=%.0f p90=%.0f\n", name, vp[np / 2], vp[np / 10], vp[9 * np / 10]);
}

static CUstream s;
static CUevent ev[2 * QUEUE];
static CUdeviceptr times;
static int blocks = 1; /* 1, or one per SM: a kernel that fills the GPU */
static unsigned long long *host_times;

static unsigned long long *slot(int launch) { return (unsigned long long *)(times + 16ull * blocks * launch); }

/* The kernel of launch i as the GPU ran it: its first block's start to its last block's end. */
static double kernel_span(int i) {
    unsigned long long lo = ~0ull, hi = 0;
    for (int b = 0; b < blocks; b++) {
        unsigned long long st = host_times[2 * ((size_t)i * blocks + b)], en = host_times[2 * ((size_t)i * blocks + b) + 1];
        if (st < lo) lo = st;
        if (en > hi) hi = en;
    }
    return (double)(hi - lo);
}

/* One launch at a time onto an idle stream (the pause lets our last kernel end). */
static void idle_case(const char *name) {
    static struct sample out[N];
    for (int i = 0; i < N; i++) {
        pause_ns(150000);
        double rec0 = now_ns();
        CK(cuEventRecord(ev[0], s));
        double rec = now_ns();
        out[i].record = rec - rec0;
        spin<<<blocks, 1, 0, (cudaStream_t)s>>>(50000, slot(i));
        double ret = now_ns();
        out[i].start_done = cuEventQuery(ev[0]) == CUDA_SUCCESS;
        out[i].host = ret - rec;
        CK(cuEventRecord(ev[1], s));
        CK(cuEventSynchronize(ev[1]));
        float ms;
        CK(cuEventElapsedTime(&ms, ev[0], ev[1]));
        out[i].bracket = ms * 1e6;
    }
    CK(cuMemcpyDtoH(host_times, times, 16ull * blocks * N));
    for (int i = 0; i < N; i++) out[i].kernel = kernel_span(i);
    report(name, out, N);
}

/* QUEUE launches back to back, each in its own bracket; the host time of all but the first is covered. */
static void queued_case(const char *name) {
    static struct sample out[N * QUEUE];
    int n = 0;
    for (int i = 0; i < N / 4; i++) {
        pause_ns(150000);
        for (int k = 0; k < QUEUE; k++) {
            double rec0 = now_ns();
            CK(cuEventRecord(ev[2 * k], s));
            double rec = now_ns();
            out[n + k].record = rec - rec0;
            spin<<<blocks, 1, 0, (cudaStream_t)s>>>(50000, slot(n + k));
            double ret = now_ns();
            out[n + k].start_done = cuEventQuery(ev[2 * k]) == CUDA_SUCCESS;
            out[n + k].host = k == 0 ? ret - rec : 0;
            CK(cuEventRecord(ev[2 * k + 1], s));
        }
        CK(cuEventSynchronize(ev[2 * QUEUE - 1]));
        for (int k = 0; k < QUEUE; k++) {
            float ms;
            CK(cuEventElapsedTime(&ms, ev[2 * k], ev[2 * k + 1]));
            out[n + k].bracket = ms * 1e6;
        }
        n += QUEUE;
    }
    CK(cuMemcpyDtoH(host_times, times, 16ull * blocks * n));
    for (int i = 0; i < n; i++) out[i].kernel = kernel_span(i);
    report(name, out, n);
}

/* A CUDA graph of GRAPH_NODES kernels of 100 us, launched onto an idle stream, one at a time: its bracket less the
 * time it held the GPU (first node's start to last node's end) and the launch's host time (graph.<name>.extra_ns,
 * what the limiter takes off as the gap), and the GPU's gaps between its nodes (graph.<name>.node_gap_ns), which
 * the graph holds: no other context runs there. */
enum { GRAPH_NODES = 20 };
static void graph_case(const char *name) {
    static struct sample out[N / 4];
    static double gaps[N / 4 * (GRAPH_NODES - 1)];
    int ng = 0;
    CUgraph g;
    CUgraphExec exec;
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int k = 0; k < GRAPH_NODES; k++) spin<<<blocks, 1, 0, (cudaStream_t)s>>>(100000, slot(k));
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiateWithFlags(&exec, g, 0));
    for (int i = 0; i < N / 4; i++) {
        pause_ns(150000);
        CK(cuEventRecord(ev[0], s));
        double rec = now_ns();
        CK(cuGraphLaunch(exec, s));
        out[i].host = now_ns() - rec;
        out[i].start_done = cuEventQuery(ev[0]) == CUDA_SUCCESS;
        CK(cuEventRecord(ev[1], s));
        CK(cuEventSynchronize(ev[1]));
        float ms;
        CK(cuEventElapsedTime(&ms, ev[0], ev[1]));
        out[i].bracket = ms * 1e6;
        out[i].record = 0;
        CK(cuMemcpyDtoH(host_times, times, 16ull * blocks * GRAPH_NODES));
        double first = 0, last = 0;
        for (int k = 0; k < GRAPH_NODES; k++) {
            unsigned long long lo = ~0ull, hi = 0;
            for (int b = 0; b < blocks; b++) {
                unsigned long long st = host_times[2 * ((size_t)k * blocks + b)];
                unsigned long long en = host_times[2 * ((size_t)k * blocks + b) + 1];
                if (st < lo) lo = st;
                if (en > hi) hi = en;
            }
            if (k == 0) first = (double)lo;
            else gaps[ng++] = (double)lo - last;
            last = (double)hi;
        }
        out[i].kernel = last - first;
    }
    report(name, out, N / 4);
    qsort(gaps, ng, sizeof gaps[0], cmp_d);
    printf("graph.%s.node_gap_ns median=%.0f p10=%.0f p90=%.0f\n", name, gaps[ng / 2], gaps[ng / 10], gaps[9 * ng / 10]);
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphDestroy(g));
}

/* GPU 0 with its primary context current. */
static CUdevice open_gpu(void) {
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    CUcontext c;
    CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    return d;
}

/* Another process with its own context: back-to-back 50 us kernels (busy) or one every 100 us (paced). */
static int neighbour(int paced, int fd) {
    open_gpu();
    CUstream ns;
    CK(cuStreamCreate(&ns, CU_STREAM_NON_BLOCKING));
    CUevent e;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    if (write(fd, "r", 1) != 1) return 1;
    close(fd);
    for (;;) {
        if (paced) {
            spin<<<1, 1, 0, (cudaStream_t)ns>>>(50000, NULL);
            pause_ns(50000);
        } else {
            for (int k = 0; k < 8; k++) spin<<<1, 1, 0, (cudaStream_t)ns>>>(50000, NULL);
            CK(cuEventRecord(e, ns));
            CK(cuEventSynchronize(e));
        }
    }
}

static pid_t start_neighbour(const char *self, int paced) {
    int p[2];
    if (pipe(p)) exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", p[1]);
        execl("/proc/self/exe", self, paced ? "paced" : "busy", fd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char c;
    if (read(p[0], &c, 1) != 1) {
        printf("fatal=neighbour did not start\n");
        exit(1);
    }
    close(p[0]);
    pause_ns(200000000);
    return pid;
}

static void stop_neighbour(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

int main(int argc, char **argv) {
    if (argc == 3) return neighbour(strcmp(argv[1], "paced") == 0, atoi(argv[2]));
    CUdevice d = open_gpu();
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2 * QUEUE; i++) CK(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    int sms = 0;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CK(cuMemAlloc(&times, 16ull * sms * N * QUEUE));
    host_times = (unsigned long long *)malloc(16ull * sms * N * QUEUE);
    spin<<<1, 1, 0, (cudaStream_t)s>>>(1000, NULL); /* load the module */
    CK(cuStreamSynchronize(s));
    idle_case("idle");
    queued_case("queued");
    blocks = sms; /* a block on every SM */
    idle_case("full.idle");
    queued_case("full.queued");
    graph_case("full.graph");
    blocks = 1;
    pid_t n = start_neighbour(argv[0], 0);
    idle_case("neighbour_busy.idle");
    queued_case("neighbour_busy.queued");
    blocks = sms;
    idle_case("neighbour_busy.full.idle");
    blocks = 1;
    stop_neighbour(n);
    n = start_neighbour(argv[0], 1);
    idle_case("neighbour_paced.idle");
    queued_case("neighbour_paced.queued");
    stop_neighbour(n);
    return 0;
}
