/*
 * Compute cap accuracy on the fake driver's simulated GPU. The program launches as fast as it can, mixing
 * every launch family (cuLaunchKernel and _ptsz, cuLaunchKernelEx and _ptsz, cuLaunchCooperativeKernel and
 * _ptsz, cuGraphLaunch and _ptsz) and kernel lengths from 10 us to 1 ms; the fake says how long its device
 * was busy. The busy fraction of wall time must not exceed DRAGPU_CORES_LIMIT by more than 5 % (relative);
 * the busy fraction of the time the launcher had a CPU must not fall short of it by more than 5 %. (On a
 * loaded machine the launcher waits for a CPU - /proc/thread-self/schedstat - and nobody launches then.)
 *
 * Every 16th launch is a stream capture of two kernels, instantiated and launched as a graph.
 *
 * Before measuring, it checks how capture is handled: launches recorded into a capturing stream are
 * neither timed nor charged (no event is recorded on the capturing stream), and while a global-mode capture
 * is open the limiter goes on measuring launches of other streams without invalidating the capture.
 *
 * usage: t_compute <cores%> <seconds> [<processes>] [at-most]    (cores 100: no limit, the device should
 * saturate). With several processes (forked before any CUDA call, sharing the claim's region) the sum of
 * their busy fractions is what must match. at-most: the busy fraction may be lower than the target (down to
 * half of it) but not higher - for launches the limiter cannot time by events. T_COMPUTE_OPEN_CAPTURE=1
 * keeps a global-mode capture open on an idle stream for the whole run. T_COMPUTE_VERBOSE=1 also prints
 * each process's share and its device's busy time over the whole run. T_COMPUTE_KERNEL_US=N: every launch is a kernel of N us (a multiple of 10; no graphs,
 * no captures). T_COMPUTE_POINTS=P: both fractions must be within P percentage points of the target instead;
 * T_COMPUTE_POINTS_BELOW=Q: at most Q points below it (default P).
 */
#include "device.h"
#include "schedstat.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
unsigned long fakecuda_calls(const char *name);
uint64_t fakecuda_busy_ns(int device);

#define SMS 132 /* run.sh sets FAKE_CUDA_SM_COUNT=132 and FAKE_CUDA_WAVE_NS=10000: one wave = 10 us */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUfunction fn[3];
static CUstream stream, cap_stream;
static CUgraphExec exec;

static void setup(void) {
    CUmodule mod;
    use_device0();
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    const char *names[3] = {"small", "medium", "large"};
    for (int i = 0; i < 3; i++) CHECK_CU(cuModuleGetFunction(&fn[i], mod, names[i]), CUDA_SUCCESS);
    CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    CHECK_CU(cuStreamCreate(&cap_stream, 0), CUDA_SUCCESS);

    /* A graph of three kernels (10 + 200 + 500 us). */
    CUgraph g;
    CHECK_CU(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    const unsigned waves[3] = {1, 20, 50};
    for (int i = 0; i < 3; i++) {
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = fn[i];
        p.gridDimX = SMS * waves[i];
        p.gridDimY = p.gridDimZ = p.blockDimY = p.blockDimZ = 1;
        p.blockDimX = 128;
        CUgraphNode node;
        CHECK_CU(cuGraphAddKernelNode_v2(&node, g, NULL, 0, &p), CUDA_SUCCESS);
    }
    CHECK_CU(cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
}

static unsigned lcg = 12345;
static unsigned next_rand(void) {
    lcg = lcg * 1103515245u + 12345u;
    return lcg >> 8;
}

/* A capture of two kernels, instantiated and launched on the stream as a graph. */
static void capture_and_launch(void) {
    CUgraph g;
    CUgraphExec e;
    CHECK_CU(cuStreamBeginCapture_v2(cap_stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn[0], SMS * 5, 1, 1, 128, 1, 1, 0, cap_stream, NULL, NULL), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn[1], SMS * 20, 1, 1, 128, 1, 1, 0, cap_stream, NULL, NULL), CUDA_SUCCESS);
    CHECK_CU(cuStreamEndCapture(cap_stream, &g), CUDA_SUCCESS);
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, stream), CUDA_SUCCESS);
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
}

static unsigned fixed_waves; /* T_COMPUTE_KERNEL_US / 10: every kernel that long */

/* One launch of some family and some length. */
static void launch_one(unsigned i) {
    if (fixed_waves && i % 8 >= 6) i = 0; /* kernels only */
    if (!fixed_waves && i % 16 == 15) {
        capture_and_launch();
        return;
    }
    static const unsigned waves[] = {1, 5, 20, 50, 100};
    unsigned grid = SMS * (fixed_waves ? fixed_waves : waves[next_rand() % 5]);
    CUfunction f = fn[next_rand() % 3];
    CUstream s = (i & 1) ? stream : NULL;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid;
    cfg.gridDimY = cfg.gridDimZ = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.blockDimX = 128;
    cfg.hStream = s;
    switch (i % 8) {
        case 0:
            CHECK_CU(cuLaunchKernel(f, grid, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            break;
        case 1:
            CHECK_CU(cuLaunchKernel_ptsz(f, grid, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            break;
        case 2:
            CHECK_CU(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_SUCCESS);
            break;
        case 3:
            CHECK_CU(cuLaunchKernelEx_ptsz(&cfg, f, NULL, NULL), CUDA_SUCCESS);
            break;
        case 4:
            CHECK_CU(cuLaunchCooperativeKernel(f, grid, 1, 1, 128, 1, 1, 0, s, NULL), CUDA_SUCCESS);
            break;
        case 5:
            CHECK_CU(cuLaunchCooperativeKernel_ptsz(f, grid, 1, 1, 128, 1, 1, 0, s, NULL), CUDA_SUCCESS);
            break;
        case 6:
            CHECK_CU(cuGraphLaunch(exec, s), CUDA_SUCCESS);
            break;
        default:
            CHECK_CU(cuGraphLaunch_ptsz(exec, s), CUDA_SUCCESS);
            break;
    }
}

static void check_capture(int limited) {
    CUstream other;
    CHECK_CU(cuStreamCreate(&other, 0), CUDA_SUCCESS);
    unsigned long records = fakecuda_calls("cuEventRecord") + fakecuda_calls("cuEventRecord_ptsz");
    uint64_t busy = fakecuda_busy_ns(0); /* the device is idle here */
    CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    for (int i = 0; i < 50; i++)
        CHECK_CU(cuLaunchKernel(fn[2], SMS * 100, 1, 1, 128, 1, 1, 0, stream, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ_U64(fakecuda_calls("cuEventRecord") + fakecuda_calls("cuEventRecord_ptsz"), records);
    CHECK_EQ_U64(fakecuda_busy_ns(0), busy); /* captured, not executed */
    /* Launches on another stream while the capture is open: timed, and their measurements are read (with
     * this thread's capture mode relaxed: the capture stays valid). */
    unsigned long queries = fakecuda_calls("cuEventQuery");
    for (int i = 0; i < 20; i++) {
        CHECK_CU(cuLaunchKernel(fn[0], SMS, 1, 1, 128, 1, 1, 0, other, NULL, NULL), CUDA_SUCCESS);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (limited) {
        CHECK(fakecuda_calls("cuEventRecord") > records, "launches outside the capture should be timed");
        CHECK(fakecuda_calls("cuEventQuery") > queries, "measurements should go on while a capture is open");
    }
    CUgraph g;
    CHECK_CU(cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
    CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
    CHECK_CU(cuStreamDestroy_v2(other), CUDA_SUCCESS);
}

/* Runs the launch loop and measures the device's busy time over the window [start, start + seconds] of
 * CLOCK_MONOTONIC (the same window in every process), in steady state: the loop has been running under
 * the same load since well before `start` (every kind of launch has been timed, the launch queue or the
 * limiter's clock has settled) and runs on without a pause. Also how long of the window the launching
 * thread waited for a CPU: a loaded machine starves the launcher, not the limiter. */
static void measure(double start, double seconds, uint64_t *busy_ns, uint64_t *window_ns, uint64_t *starved_ns) {
    unsigned i = 0;
    for (; now_s() < start; i++) launch_one(i);
    uint64_t b0 = fakecuda_busy_ns(0), d0 = run_delay_ns();
    double t0 = now_s();
    for (; now_s() - t0 < seconds; i++) launch_one(i);
    *busy_ns = fakecuda_busy_ns(0) - b0;
    *window_ns = (uint64_t)((now_s() - t0) * 1e9);
    *starved_ns = run_delay_ns() - d0;
    /* With a global-mode capture open (T_COMPUTE_OPEN_CAPTURE) the real driver lets this thread wait for a
     * stream only in relaxed mode (and cuCtxSynchronize not at all): the application's business. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(stream), CUDA_SUCCESS);
    CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    CHECK(argc >= 3, "usage: t_compute <cores%%> <seconds> [<processes>]");
    int cores = atoi(argv[1]);
    double seconds = atof(argv[2]);
    int procs = argc > 3 ? atoi(argv[3]) : 1;
    int at_most = argc > 4 && strcmp(argv[4], "at-most") == 0;
    CHECK(cores >= 1 && cores <= 100 && seconds > 0 && procs >= 1 && procs <= 8, "bad arguments");
    const char *open_capture = getenv("T_COMPUTE_OPEN_CAPTURE");
    fixed_waves = getenv("T_COMPUTE_KERNEL_US") ? (unsigned)atoi(getenv("T_COMPUTE_KERNEL_US")) / 10 : 0;
    double points = getenv("T_COMPUTE_POINTS") ? atof(getenv("T_COMPUTE_POINTS")) : 0;
    double below = getenv("T_COMPUTE_POINTS_BELOW") ? atof(getenv("T_COMPUTE_POINTS_BELOW")) : points;

    int fds[8][2];
    pid_t pids[8];
    double start = now_s() + 0.4; /* time enough to set up and warm up in every process */
    for (int p = 0; p < procs; p++) {
        CHECK(pipe(fds[p]) == 0, "pipe");
        pids[p] = fork();
        CHECK(pids[p] >= 0, "fork");
        if (pids[p] == 0) {
            setup();
            if (procs == 1) check_capture(cores < 100 && !at_most); /* at-most: no events to time with */
            CUstream idle;
            if (open_capture && *open_capture == '1') {
                CHECK_CU(cuStreamCreate(&idle, 0), CUDA_SUCCESS);
                CHECK_CU(cuStreamBeginCapture_v2(idle, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            }
            uint64_t r[4];
            measure(start, seconds, &r[0], &r[1], &r[2]);
            if (open_capture && *open_capture == '1') {
                CUgraph g;
                CHECK_CU(cuStreamEndCapture(idle, &g), CUDA_SUCCESS); /* still valid */
            }
            CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
            r[3] = fakecuda_busy_ns(0); /* everything this process ran, warm-up included */
            CHECK(write(fds[p][1], r, sizeof r) == (ssize_t)sizeof r, "write");
            _exit(0);
        }
        close(fds[p][1]);
    }
    /* busy: the share of wall time, which the cap must never exceed. ran: the share of the time the
     * launchers had a CPU, which must reach the target: time a launcher waited for a CPU (other programs
     * on a loaded machine) is time nobody launched, and the cap is not what took it. */
    double busy = 0, ran = 0, starved = 0;
    for (int p = 0; p < procs; p++) {
        uint64_t r[4] = {0, 0, 0, 0};
        CHECK(read(fds[p][0], r, sizeof r) == (ssize_t)sizeof r, "worker %d reported nothing", p);
        int status;
        waitpid(pids[p], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker %d failed", p);
        uint64_t had_cpu = r[2] < r[1] ? r[1] - r[2] : 1;
        busy += 100.0 * (double)r[0] / (double)r[1];
        ran += 100.0 * (double)r[0] / (double)had_cpu;
        if (100.0 * (double)r[2] / (double)r[1] > starved) starved = 100.0 * (double)r[2] / (double)r[1];
        if (getenv("T_COMPUTE_VERBOSE"))
            fprintf(stderr,
                    "  worker %d: busy %.2f%% window %.3f s, waited for a CPU %.3f s, device busy in all %.6f s\n", p,
                    100.0 * (double)r[0] / (double)r[1], (double)r[1] / 1e9, (double)r[2] / 1e9, (double)r[3] / 1e9);
    }
    double error = 100.0 * (busy - cores) / cores, ran_error = 100.0 * (ran - cores) / cores;
    printf("compute cap: target %3d%%  busy %6.2f%%  error %+6.2f%%  (%d process%s, %.1f s; while running %6.2f%%, "
           "%.0f%% waiting for a CPU)\n",
           cores, busy, error, procs, procs == 1 ? "" : "es", seconds, ran, starved);
    CHECK(starved < 75.0, "the launcher waited for a CPU %.0f%% of the window: too loaded a machine to measure",
          starved);
    if (points > 0 && cores < 100) {
        CHECK(busy <= cores + points, "busy %.2f%% is more than %.1f points above %d%%", busy, points, cores);
        CHECK(ran >= cores - below, "busy %.2f%% of the time the launcher ran is more than %.1f points below %d%%", ran,
              below, cores);
    } else if (at_most) {
        CHECK(error <= 5.0, "busy %.2f%% is above %d%%", busy, cores);
        CHECK(ran_error >= -50.0, "busy %.2f%% of the time it ran is far below %d%%", ran, cores);
    } else if (cores < 100) {
        CHECK(error <= 5.0, "busy %.2f%% is more than 5%% above %d%%", busy, cores);
        CHECK(ran_error >= -5.0, "busy %.2f%% of the time the launcher ran is more than 5%% below %d%%", ran, cores);
    } else {
        CHECK(ran >= 90.0, "an unlimited launcher should keep the device busy, got %.2f%%", ran);
    }
    return 0;
}
