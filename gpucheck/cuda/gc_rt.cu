/*
 * gc_rt: a CUDA runtime-API program for the GPU check, built twice (libcudart linked dynamically and
 * statically). The runtime resolves the driver through cuGetProcAddress, the path the limiter must
 * route. Every mode prints `key=value` lines on stdout; exit 0 when it ran (a refused allocation
 * included), 2 for a usage error, 3 when CUDA device 0 cannot be set up.
 *
 *   gc_rt info                                 total= free= (cudaMemGetInfo) device_total= sms=
 *   gc_rt family <name> <chunk> <max> [--hold] names: malloc async managed entry graph
 *   gc_rt busy <seconds> <kernel-us> [--graph N | --periodic] [--bursts ON-MS OFF-MS] [--out FILE] [--ready]
 *       launch spin kernels (one block per SM) for <seconds> of host time; each kernel records on the
 *       GPU's global timer its start, when its blocks stopped spinning, and its end after its own
 *       bookkeeping (the atomics that count its blocks, which hold the GPU too); prints launches=
 *       busy= window_ns= kernel_ns= (start to end) spin_ns= (start to spun) and, with --out, writes
 *       the (start, spun, end) triples as little-endian uint64 to FILE.
 *       --graph N: launch a CUDA graph of N kernels instead of single kernels.
 *       --periodic: every fourth kernel spins 20 times as long (the same kernel and grid, another argument:
 *       a pattern the limiter must not see only one phase of).
 *       --bursts ON-MS OFF-MS: idle (nothing queued) for OFF-MS, then launch for ON-MS, and again: a claim
 *       that wakes up after idling, again and again. Prints wakes= (the host's time at the start of each
 *       burst, on the GPU's global timer: the offset of the two clocks is taken beforehand from the launch of
 *       a kernel that reads the timer, the one of the shortest round trip of 20).
 *   gc_rt sms <blocks> <kernel-us>
 *       one launch of <blocks> spinning blocks; prints sms_used= (distinct %smid) sms= elapsed_ns=
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024ULL)
typedef unsigned long long ull;

static cudaStream_t g_stream;

__device__ __forceinline__ ull global_ns() {
    ull t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned sm_id() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}

/* state[0]: index of the running launch; state[1]: blocks done in it. Kernels of one stream run one
 * after the other, so every block of launch k reads k, and the last block to finish advances it.
 * starts[k]: the first block's start; spun[k]: when the last block stopped spinning; ends[k]: when that
 * block had counted itself and advanced the launch index, the kernel's last work. A kernel holds the GPU
 * until its end, and a bracket of events around it (the limiter's measure) holds that time too. */
__global__ void spin(ull dur_ns, ull *starts, ull *spun, ull *ends, unsigned *state, unsigned cap) {
    __shared__ ull t0;
    if (threadIdx.x == 0) t0 = global_ns();
    __syncthreads();
    unsigned slot = *(volatile unsigned *)&state[0];
    if (threadIdx.x == 0 && slot < cap) atomicMin(&starts[slot], t0);
    while (global_ns() - t0 < dur_ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (slot < cap) atomicMax(&spun[slot], global_ns());
        __threadfence();
        unsigned done = atomicAdd(&state[1], 1u);
        if (done == gridDim.x - 1) {
            state[1] = 0;
            __threadfence();
            atomicExch(&state[0], slot + 1);
            if (slot < cap) ends[slot] = global_ns();
        }
    }
}

__global__ void stamp(ull *t) { *t = global_ns(); }

__global__ void spin_sm(ull dur_ns, unsigned *seen, unsigned nseen) {
    if (threadIdx.x == 0) {
        unsigned id = sm_id();
        if (id < nseen) atomicExch(&seen[id], 1u);
        ull t0 = global_ns();
        while (global_ns() - t0 < dur_ns) {
        }
    }
}

static const char *err_name(cudaError_t e) { return cudaGetErrorName(e); }

static int setup(void) {
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaFree(0);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        printf("error=%s\n", err_name(e));
        fprintf(stderr, "gc_rt: cannot set up CUDA device 0: %s\n", err_name(e));
        return 3;
    }
    return 0;
}

static int sm_count(void) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
    return n > 0 ? n : 1;
}

static int cmd_info(void) {
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) printf("mem_get_info_error=%s\n", err_name(e));
    else printf("total=%zu\nfree=%zu\n", total_b, free_b);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        printf("device_total=%zu\nname=%s\ncc=%d.%d\n", prop.totalGlobalMem, prop.name, prop.major, prop.minor);
    }
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    printf("sms=%d\nruntime_version=%d\ndriver_version=%d\n", sm_count(), runtime, driver);
    return 0;
}

typedef CUresult (*drv_alloc_fn)(CUdeviceptr *, size_t);
static drv_alloc_fn g_entry;

static int family_setup(const char *name) {
    cudaError_t e = cudaSuccess;
    if (!strcmp(name, "async") || !strcmp(name, "graph")) {
        cudaMemPool_t pool;
        e = cudaDeviceGetDefaultMemPool(&pool, 0);
        ull threshold = UINT64_MAX;
        if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    } else if (!strcmp(name, "entry")) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSuccess;
        e = cudaGetDriverEntryPointByVersion("cuMemAlloc", &p, 3020, cudaEnableDefault, &status);
        if (e == cudaSuccess && (p == NULL || status != cudaDriverEntryPointSuccess)) e = cudaErrorSymbolNotFound;
        g_entry = (drv_alloc_fn)p;
    }
    if (e != cudaSuccess) printf("setup_error=%s\n", err_name(e));
    return e == cudaSuccess ? 0 : 1;
}

/* cudaError of one allocation that stays held; driver errors are mapped to their runtime names. */
static const char *family_alloc(const char *name, size_t size) {
    void *p = NULL;
    cudaError_t e = cudaErrorInvalidValue;
    if (!strcmp(name, "malloc")) e = cudaMalloc(&p, size);
    else if (!strcmp(name, "managed")) e = cudaMallocManaged(&p, size, cudaMemAttachGlobal);
    else if (!strcmp(name, "async")) {
        e = cudaMallocAsync(&p, size, g_stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    } else if (!strcmp(name, "graph")) {
        /* Captured stream-ordered allocation without a free: a graph memory node that outlives the launch. */
        cudaGraph_t g;
        cudaGraphExec_t exec;
        e = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
        if (e == cudaSuccess) {
            cudaError_t a = cudaMallocAsync(&p, size, g_stream);
            e = cudaStreamEndCapture(g_stream, &g);
            if (a != cudaSuccess) e = a;
        }
        if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
        if (e == cudaSuccess) e = cudaGraphLaunch(exec, g_stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    } else if (!strcmp(name, "entry") && g_entry != NULL) {
        CUdeviceptr d;
        CUresult r = g_entry(&d, size);
        if (r == CUDA_SUCCESS) return "cudaSuccess";
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return "cudaErrorMemoryAllocation";
        return "cudaErrorUnknown";
    }
    if (e != cudaSuccess) cudaGetLastError(); /* clear a sticky-free error so the next call is clean */
    return err_name(e);
}

static void hold(void) {
    char buf[256];
    printf("holding\n");
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {
    }
}

static int cmd_family(const char *name, size_t chunk, size_t max, int do_hold) {
    if (family_setup(name) != 0) return 0;
    size_t allocated = 0, count = 0, min_chunk = !strcmp(name, "graph") ? chunk : MIB;
    const char *last = "cudaSuccess", *stopped = "refused";
    for (size_t c = chunk; c >= min_chunk; c /= 2) {
        for (;;) {
            if (allocated + c > max) break;
            last = family_alloc(name, c);
            if (strcmp(last, "cudaSuccess") != 0) break;
            allocated += c;
            count++;
        }
        if (!strcmp(last, "cudaSuccess")) {
            stopped = "max";
            break;
        }
        if (strcmp(last, "cudaErrorMemoryAllocation") != 0 || c == min_chunk) break;
    }
    printf("allocated=%zu\ncount=%zu\nlast=%s\nstopped=%s\n", allocated, count, last, stopped);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) printf("after_total=%zu\nafter_free=%zu\n", total_b, free_b);
    fflush(stdout);
    if (do_hold) hold();
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The GPU's global timer less the host's CLOCK_MONOTONIC (ns), from the stamp of the shortest round trip. */
static long long gpu_minus_host(cudaError_t *e) {
    ull *d, h = 0;
    long long best = -1, offset = 0;
    *e = cudaMalloc(&d, sizeof(ull));
    for (int i = 0; *e == cudaSuccess && i < 20; i++) {
        long long a = mono_ns();
        stamp<<<1, 1, 0, g_stream>>>(d);
        *e = cudaStreamSynchronize(g_stream);
        long long b = mono_ns();
        if (*e == cudaSuccess) *e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
        if (*e == cudaSuccess && (best < 0 || b - a < best)) best = b - a, offset = (long long)h - (a + b) / 2;
    }
    cudaFree(d);
    return offset;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int cmd_busy(double seconds, double kernel_us, int graph_n, int periodic, double on_ms, double off_ms,
                    const char *out, int ready) {
    const unsigned cap = 1u << 20;
    ull *starts, *spun, *ends;
    unsigned *state;
    cudaError_t e = cudaMalloc(&starts, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMalloc(&spun, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMalloc(&ends, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMalloc(&state, 2 * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(starts, 0xff, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMemset(spun, 0, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMemset(ends, 0, cap * sizeof(ull));
    if (e == cudaSuccess) e = cudaMemset(state, 0, 2 * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("error=%s\n", err_name(e));
        return 0;
    }
    long long offset = on_ms > 0 ? gpu_minus_host(&e) : 0;
    if (e != cudaSuccess) {
        printf("error=%s\n", err_name(e));
        return 0;
    }
    enum { WAKES = 1024 };
    static long long wakes[WAKES];
    int nwakes = 0, in_burst = 0;
    int blocks = sm_count();
    ull dur = (ull)(kernel_us * 1000.0);
    cudaGraphExec_t exec = NULL;
    if (graph_n > 0) {
        cudaGraph_t g;
        e = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
        for (int i = 0; e == cudaSuccess && i < graph_n; i++) {
            spin<<<blocks, 32, 0, g_stream>>>(dur, starts, spun, ends, state, cap);
        }
        if (e == cudaSuccess) e = cudaStreamEndCapture(g_stream, &g);
        if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
        if (e != cudaSuccess) {
            printf("error=%s\n", err_name(e));
            return 0;
        }
    }
    if (ready) {
        printf("ready\n");
        fflush(stdout);
        char c;
        if (read(0, &c, 1) < 0) return 0; /* go on one byte (or end of file) on stdin */
    }
    double t0 = now_s(), burst = t0 + off_ms / 1e3; /* bursts: the next one starts then */
    ull launched = 0;
    while (now_s() - t0 < seconds && launched + (graph_n > 0 ? graph_n : 1) <= cap) {
        if (on_ms > 0) {
            double t = now_s();
            if (t < burst) {
                sleep_s(burst - t < t0 + seconds - t ? burst - t : t0 + seconds - t);
                continue;
            }
            if (t >= burst + on_ms / 1e3) { /* the burst is over: let its work finish, then idle */
                e = cudaStreamSynchronize(g_stream);
                if (e != cudaSuccess) break;
                burst += (on_ms + off_ms) / 1e3;
                in_burst = 0;
                continue;
            }
            if (!in_burst && nwakes < WAKES) wakes[nwakes++] = mono_ns() + offset;
            in_burst = 1;
        }
        if (graph_n > 0) {
            e = cudaGraphLaunch(exec, g_stream);
            launched += graph_n;
        } else {
            ull d = periodic && launched % 4 == 0 ? 20 * dur : dur;
            spin<<<blocks, 32, 0, g_stream>>>(d, starts, spun, ends, state, cap);
            e = cudaGetLastError();
            launched++;
        }
        if (e != cudaSuccess) break;
    }
    double host_s = now_s() - t0;
    if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream);
    if (e != cudaSuccess) {
        printf("error=%s\n", err_name(e));
        return 0;
    }
    unsigned done[2];
    cudaMemcpy(done, state, sizeof done, cudaMemcpyDeviceToHost);
    unsigned n = done[0] < cap ? done[0] : cap;
    ull *hs = (ull *)malloc(n * sizeof(ull) + 1), *hp = (ull *)malloc(n * sizeof(ull) + 1),
        *he = (ull *)malloc(n * sizeof(ull) + 1);
    cudaMemcpy(hs, starts, n * sizeof(ull), cudaMemcpyDeviceToHost);
    cudaMemcpy(hp, spun, n * sizeof(ull), cudaMemcpyDeviceToHost);
    cudaMemcpy(he, ends, n * sizeof(ull), cudaMemcpyDeviceToHost);
    ull busy = 0, spinning = 0, first = n ? hs[0] : 0, last = n ? he[n - 1] : 0;
    for (unsigned i = 0; i < n; i++) {
        busy += he[i] > hs[i] ? he[i] - hs[i] : 0;
        spinning += hp[i] > hs[i] ? hp[i] - hs[i] : 0;
    }
    ull window = last > first ? last - first : 0;
    printf("launches=%llu\nkernels=%u\nhost_s=%.6f\nwindow_ns=%llu\nbusy_ns=%llu\nbusy=%.6f\nkernel_ns=%.1f\n"
           "spin_ns=%.1f\n",
           launched, n, host_s, window, busy, window ? (double)busy / (double)window : 0.0,
           n ? (double)busy / n : 0.0, n ? (double)spinning / n : 0.0);
    if (on_ms > 0) {
        printf("wakes=");
        for (int i = 0; i < nwakes; i++) printf("%s%lld", i ? "," : "", wakes[i]);
        printf("\n");
    }
    if (out != NULL) {
        FILE *f = fopen(out, "wb");
        if (f == NULL) {
            printf("out_error=cannot open %s\n", out);
        } else {
            for (unsigned i = 0; i < n; i++) {
                fwrite(&hs[i], sizeof(ull), 1, f);
                fwrite(&hp[i], sizeof(ull), 1, f);
                fwrite(&he[i], sizeof(ull), 1, f);
            }
            fclose(f);
        }
    }
    free(hs);
    free(hp);
    free(he);
    return 0;
}

static int cmd_sms(int blocks, double kernel_us) {
    const unsigned nseen = 4096;
    unsigned *seen;
    cudaError_t e = cudaMalloc(&seen, nseen * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(seen, 0, nseen * sizeof(unsigned));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    if (e == cudaSuccess) {
        cudaEventRecord(a, g_stream);
        spin_sm<<<blocks, 32, 0, g_stream>>>((ull)(kernel_us * 1000.0), seen, nseen);
        cudaEventRecord(b, g_stream);
        e = cudaStreamSynchronize(g_stream);
    }
    if (e != cudaSuccess) {
        printf("error=%s\n", err_name(e));
        return 0;
    }
    unsigned *h = (unsigned *)calloc(nseen, sizeof(unsigned));
    cudaMemcpy(h, seen, nseen * sizeof(unsigned), cudaMemcpyDeviceToHost);
    int used = 0;
    for (unsigned i = 0; i < nseen; i++) used += h[i] != 0;
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    printf("sms_used=%d\nsms=%d\nelapsed_ns=%.0f\n", used, sm_count(), ms * 1e6);
    free(h);
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: gc_rt info | family <name> <chunk> <max> [--hold] | "
            "busy <seconds> <kernel-us> [--graph N | --periodic] [--bursts ON-MS OFF-MS] [--out FILE] [--ready] | "
            "sms <blocks> <kernel-us>\n");
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info") && argc == 2) {
        int rc = setup();
        return rc ? rc : cmd_info();
    }
    if (!strcmp(cmd, "family") && (argc == 5 || argc == 6)) {
        char *e1, *e2;
        unsigned long long chunk = strtoull(argv[3], &e1, 10), max = strtoull(argv[4], &e2, 10);
        int do_hold = argc == 6 && !strcmp(argv[5], "--hold");
        if (*e1 || *e2 || chunk == 0 || (argc == 6 && !do_hold)) return usage();
        int rc = setup();
        return rc ? rc : cmd_family(argv[2], (size_t)chunk, (size_t)max, do_hold);
    }
    if (!strcmp(cmd, "busy") && argc >= 4) {
        double seconds = atof(argv[2]), kernel_us = atof(argv[3]);
        int graph_n = 0, periodic = 0, ready = 0;
        double on_ms = 0, off_ms = 0;
        const char *out = NULL;
        for (int i = 4; i < argc; i++) {
            if (!strcmp(argv[i], "--graph") && i + 1 < argc) graph_n = atoi(argv[++i]);
            else if (!strcmp(argv[i], "--periodic")) periodic = 1;
            else if (!strcmp(argv[i], "--bursts") && i + 2 < argc) on_ms = atof(argv[++i]), off_ms = atof(argv[++i]);
            else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
            else if (!strcmp(argv[i], "--ready")) ready = 1;
            else return usage();
        }
        if (seconds <= 0 || kernel_us <= 0 || graph_n < 0 || (graph_n && periodic) || on_ms < 0 || off_ms < 0 ||
            (on_ms > 0) != (off_ms > 0))
            return usage();
        int rc = setup();
        return rc ? rc : cmd_busy(seconds, kernel_us, graph_n, periodic, on_ms, off_ms, out, ready);
    }
    if (!strcmp(cmd, "sms") && argc == 4) {
        int blocks = atoi(argv[2]);
        double kernel_us = atof(argv[3]);
        if (blocks <= 0 || kernel_us <= 0) return usage();
        int rc = setup();
        return rc ? rc : cmd_sms(blocks, kernel_us);
    }
    return usage();
}
