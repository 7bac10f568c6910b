/*
 * Every launch counts against the compute share, wherever the limiter has to find its device. One scenario
 * per run; the fake's simulated GPU says how busy the launch's device was over a window of steady launching,
 * which must be at most 5 % (relative) above DRAGPU_CORES_LIMIT, and at most 5 % below it over the time the
 * launcher had a CPU (tests/schedstat.h).
 *
 *   other-device  launches on a stream of device 1 while device 0's context is current (two GPUs)
 *   no-context    context-less CUkernel launches of 2 ms (ten times the limiter's prior) on a stream, with no
 *                 current context at all: the share holds only if they are measured (the limiter must make
 *                 the stream's context current around its timing events, which need one)
 *   long-kernels  kernels of 10 ms, longer than the limiter's burst: paid as debt
 *   cold-burst    a process that never launched before launches 2 ms kernels (ten times the limiter's prior)
 *                 as fast as it can: over the first <seconds> from its first launch the device may be busy for
 *                 the share of that window and of the limiter's 4 ms burst, and two kernels more: the last
 *                 admitted (admission needs only the clock within the burst) and the first (admitted at the
 *                 prior before any was measured) - not for a queue of them admitted at the prior
 *   periodic      one function, grid and stream whose kernels' times repeat a pattern of four (one of 400 us,
 *                 three of 20 us: their data differs, which the limiter cannot see) - as the layers of a model
 *                 repeat: the share holds only if the launches the limiter times are not always the same phase
 *
 *   predicted     a tenant that knows how the limiter draws the launches it times once a kind is learned (the
 *                 sequence of a generator with a fixed seed, replayed here): one function and grid, 20 us on
 *                 the launches it expects timed, 1 ms on the others - the share holds only if the tenant cannot
 *                 predict the draws
 *   changed       one function and grid learned at 20 us, then every launch of it 1 ms: the random draws must
 *                 catch the change
 *   changed-short the same learned at 2 us (launched ten times as often before the change shows), measured from
 *                 the change on: at most 30 % (relative) above the share over the window - the launches that ran
 *                 at the old estimate before a timed one showed the change are charged what they took, as the
 *                 timed ones complete (before: a 30 % claim 54 % busy over the first 3 s, 100 % over the first)
 *   new-kinds     every launch a kind never seen (a new grid size), each 2 ms, after the limiter has learned
 *                 20 us kernels, as fast as it can: over the first <seconds> the device may be busy as for
 *                 cold-burst - not for a queue of new kinds each admitted at the estimate of an unknown launch
 *
 *   quiet         two processes of the claim: one launches a kernel of 1 s (a kind never measured, admitted at
 *                 the prior) and then makes no CUDA call for longer than the window; the other launches short
 *                 kernels all along. The claim's GPU time over the window (both devices') may exceed the share
 *                 only by what the 1 s kernel took before its measurement came back: the quiet process's debt
 *                 must reach the claim's clock without it calling CUDA again
 *
 * usage: t_launch <scenario> <cores%> <seconds>    (T_LAUNCH_WARM_S: the launching before the window, default 0.3 s,
 * changed-short 0)
 */
#include "device.h"
#include "schedstat.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t fakecuda_busy_ns(int device);

#define SMS 132 /* run.sh: FAKE_CUDA_SM_COUNT=132, FAKE_CUDA_WAVE_NS=10000 */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUfunction fn;
static CUstream stream;
static unsigned waves_of[4] = {1, 5, 20, 50};
static int long_kernels, prior_beaters, periodic, predicted, new_kinds, changed;
static uint64_t guess = 0x9e3779b97f4a7c15ull; /* the seed of the generator the limiter drew with before */

/* Whether the tenant expects the limiter to time its next launch: xorshift64 from the fixed seed, one in eight. */
static int expect_timed(void) {
    guess ^= guess << 13;
    guess ^= guess >> 7;
    guess ^= guess << 17;
    return (guess >> 32) % 8 == 0;
}

static void spin(uint64_t ns, unsigned blocks) {
    void *args[] = {&ns};
    CHECK_CU(cuLaunchKernel(fn, blocks, 1, 1, 128, 1, 1, 0, stream, args, NULL), CUDA_SUCCESS);
}

static void launch(unsigned i) {
    if (predicted || changed) {
        spin(changed || !expect_timed() ? 1000000 : 20000, SMS);
        return;
    }
    if (new_kinds) {
        spin(2000000, SMS + 1 + i); /* a grid size never launched before */
        return;
    }
    if (periodic) { /* the fake's "spin" runs for its argument's nanoseconds */
        uint64_t ns = i % 4 == 0 ? 400000 : 20000;
        void *args[] = {&ns};
        CHECK_CU(cuLaunchKernel(fn, SMS, 1, 1, 128, 1, 1, 0, stream, args, NULL), CUDA_SUCCESS);
        return;
    }
    unsigned waves = long_kernels ? 1000 : prior_beaters ? 200 : waves_of[i % 4];
    CHECK_CU(cuLaunchKernel(fn, SMS * waves, 1, 1, 128, 1, 1, 0, stream, NULL, NULL), CUDA_SUCCESS);
}

struct sample {
    uint64_t b0;
    double t0, seconds, window, busy_s;
    _Atomic int done;
};

static void *sampler(void *arg) {
    struct sample *sm = (struct sample *)arg;
    double left;
    while ((left = sm->t0 + sm->seconds - now_s()) > 0) {
        struct timespec ts = {0, (long)(left * 1e9 < 1e6 ? left * 1e9 : 1e6)};
        nanosleep(&ts, NULL);
    }
    sm->busy_s = (double)(fakecuda_busy_ns(0) - sm->b0) / 1e9;
    sm->window = now_s() - sm->t0;
    atomic_store(&sm->done, 1);
    return NULL;
}

static void sleep_until(double t) {
    for (double n = now_s(); n < t; n = now_s()) {
        struct timespec ts = {(time_t)(t - n), (long)((t - n - (double)(time_t)(t - n)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* The quiet scenario: processes forked before any CUDA call share the claim's region (the environment's). */
static int quiet(int cores, double seconds) {
    double t0 = now_s() + 0.4;
    int fds[2][2];
    pid_t pids[2];
    for (int p = 0; p < 2; p++) {
        CHECK(pipe(fds[p]) == 0, "pipe");
        pids[p] = fork();
        CHECK(pids[p] >= 0, "fork");
        if (pids[p] != 0) {
            close(fds[p][1]);
            continue;
        }
        use_device0();
        CUmodule mod;
        CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
        CHECK_CU(cuModuleGetFunction(&fn, mod, p == 0 ? "spin" : "k"), CUDA_SUCCESS);
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        uint64_t b0 = 0;
        if (p == 0) { /* launches once, then goes quiet past the window */
            sleep_until(t0);
            b0 = fakecuda_busy_ns(0);
            spin(1000000000ull, SMS);
            sleep_until(t0 + seconds);
        } else { /* launches all along */
            unsigned i = 0;
            while (now_s() < t0 - 0.2) launch(i++);
            b0 = fakecuda_busy_ns(0);
            while (now_s() < t0 + seconds)
                CHECK_CU(cuLaunchKernel(fn, SMS * 5, 1, 1, 128, 1, 1, 0, stream, NULL, NULL), CUDA_SUCCESS);
        }
        uint64_t busy = fakecuda_busy_ns(0) - b0;
        CHECK(write(fds[p][1], &busy, sizeof busy) == (ssize_t)sizeof busy, "write");
        _exit(0);
    }
    double total = 0, each[2] = {0, 0};
    for (int p = 0; p < 2; p++) {
        uint64_t busy = 0;
        CHECK(read(fds[p][0], &busy, sizeof busy) == (ssize_t)sizeof busy, "process %d reported nothing", p);
        int status;
        waitpid(pids[p], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d failed", p);
        each[p] = 100.0 * (double)busy / (seconds * 1e9);
        total += each[p];
    }
    printf("t_launch quiet: the claim's GPU busy %.2f%% of %.1f s (the quiet process %.2f%%, the other %.2f%%; share "
           "%d%%)\n",
           total, seconds, each[0], each[1], cores);
    CHECK(total <= cores + 5,
          "the claim ran %.2f%% under a %d%% share: the quiet process's kernel was not charged as it ran", total,
          cores);
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc == 4, "usage: t_launch <scenario> <cores%%> <seconds>");
    if (strcmp(argv[1], "quiet") == 0) return quiet(atoi(argv[2]), atof(argv[3]));
    const char *scenario = argv[1];
    int cores = atoi(argv[2]);
    double seconds = atof(argv[3]);
    CHECK(cores >= 1 && cores < 100 && seconds > 0, "bad arguments");
    int device = 0;
    CUcontext ctx0 = use_device0();
    CUmodule mod;
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "k"), CUDA_SUCCESS);
    if (strcmp(scenario, "other-device") == 0) {
        CUdevice d1;
        CUcontext ctx1;
        CHECK_CU(cuDeviceGet(&d1, 1), CUDA_SUCCESS);
        CHECK_CU(cuDevicePrimaryCtxRetain(&ctx1, d1), CUDA_SUCCESS);
        CHECK_CU(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        CHECK_CU(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
        device = 1;
    } else if (strcmp(scenario, "no-context") == 0) {
        CUlibrary lib;
        CUkernel k;
        CHECK_CU(cuLibraryLoadData(&lib, "image", NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
        CHECK_CU(cuLibraryGetKernel(&k, lib, "k"), CUDA_SUCCESS);
        fn = (CUfunction)k; /* cuda.h: a CUkernel may be launched where a CUfunction is expected */
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        CHECK_CU(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
        CUcontext none;
        CHECK_CU(cuCtxGetCurrent(&none), CUDA_SUCCESS);
        CHECK(none == NULL, "a context is still current");
        prior_beaters = 1;
    } else if (strcmp(scenario, "cold-burst") == 0 || strcmp(scenario, "new-kinds") == 0) {
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        prior_beaters = 1;
        if (strcmp(scenario, "new-kinds") == 0) {
            CHECK_CU(cuModuleGetFunction(&fn, mod, "spin"), CUDA_SUCCESS);
            for (int k = 0; k < 8; k++) spin(20000, SMS); /* short kernels learned first */
            CHECK_CU(cuStreamSynchronize(stream), CUDA_SUCCESS);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            spin(20000, SMS); /* measured by now: the estimate of an unknown launch is 20 us */
            CHECK_CU(cuStreamSynchronize(stream), CUDA_SUCCESS);
            nanosleep(&ts, NULL);
            prior_beaters = 0;
            new_kinds = 1;
        }
        /* The device's busy time is read at the window's end by another thread: the launcher may be asleep in a
         * launch then (paying for what it launched). */
        struct sample sm = {.b0 = fakecuda_busy_ns(0), .t0 = now_s(), .seconds = seconds};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, sampler, &sm) == 0, "pthread_create");
        unsigned n = 0;
        while (!atomic_load(&sm.done)) launch(n++);
        CHECK(pthread_join(th, NULL) == 0, "pthread_join");
        double window = sm.window, busy_s = sm.busy_s;
        double allowed = cores / 100.0 * (window + 0.004) + 2 * 0.002;
        printf("t_launch %s: %u launches of 2 ms, device busy %.1f ms of the first %.1f ms (at most %.1f ms "
               "at %d%%)\n",
               scenario, n, busy_s * 1e3, window * 1e3, allowed * 1e3, cores);
        CHECK(busy_s <= allowed, "busy %.1f ms in the first %.1f ms: more than %d%% of it and two kernels",
              busy_s * 1e3, window * 1e3, cores);
        return 0;
    } else if (strcmp(scenario, "long-kernels") == 0) {
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        long_kernels = 1;
    } else if (strcmp(scenario, "predicted") == 0 || strcmp(scenario, "changed") == 0 ||
               strcmp(scenario, "changed-short") == 0) {
        CHECK_CU(cuModuleGetFunction(&fn, mod, "spin"), CUDA_SUCCESS);
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        /* The kind is learned from short kernels first: eight timed launches, all measured by the next launch. */
        for (int k = 0; k < 8; k++) spin(strcmp(scenario, "changed-short") == 0 ? 2000 : 20000, SMS);
        CHECK_CU(cuStreamSynchronize(stream), CUDA_SUCCESS);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        predicted = strcmp(scenario, "predicted") == 0;
        changed = !predicted;
    } else if (strcmp(scenario, "periodic") == 0) {
        CHECK_CU(cuModuleGetFunction(&fn, mod, "spin"), CUDA_SUCCESS);
        CHECK_CU(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
        periodic = 1;
    } else {
        CHECK(0, "unknown scenario %s", scenario);
    }

    unsigned i = 0;
    int from_change = strcmp(scenario, "changed-short") == 0;
    double warm = now_s() + (getenv("T_LAUNCH_WARM_S") ? atof(getenv("T_LAUNCH_WARM_S")) : from_change ? 0 : 0.3);
    while (now_s() < warm) launch(i++);
    uint64_t b0 = fakecuda_busy_ns(device), d0 = run_delay_ns();
    double t0 = now_s();
    while (now_s() - t0 < seconds) launch(i++);
    double window = now_s() - t0, starved = (double)(run_delay_ns() - d0) / 1e9;
    double busy_s = (double)(fakecuda_busy_ns(device) - b0) / 1e9;
    double busy = 100.0 * busy_s / window, ran = 100.0 * busy_s / (window - starved > 0.001 ? window - starved : 0.001);
    double error = 100.0 * (busy - cores) / cores;
    printf("t_launch %s: target %d%%  busy %.2f%%  error %+.2f%%  (while running %.2f%%, %.0f%% waiting for a CPU)\n",
           scenario, cores, busy, error, ran, 100.0 * starved / window);
    CHECK(starved < 0.75 * window, "the launcher waited for a CPU most of the window: too loaded a machine to measure");
    double above = from_change ? 30.0 : 5.0;
    CHECK(error <= above, "busy %.2f%% is more than %.0f%% above %d%%", busy, above, cores);
    CHECK(predicted || from_change || ran >= 0.95 * cores,
          "busy %.2f%% of the time the launcher ran is more than 5%% below %d%%", ran, cores);
    return 0;
}
