/*
 * Facts the limiter's fake driver must reproduce, asked of a real GPU (run WITHOUT the limiter):
 *
 *   capture  which driver calls made by the capturing thread, right after a captured cudaMallocAsync,
 *            invalidate a global- or thread-local-mode capture: one line per (mode, call) with the call's
 *            result and cuStreamEndCapture's
 *   timing   what an event bracket charges around a kernel: the kernel's own time (%globaltimer), the
 *            bracket's cuEventElapsedTime, an empty bracket, the gap between back-to-back kernels, and the
 *            host cost of cuEventQuery
 *
 * build: nvcc -O2 -o capture_probe capture_probe.cu -lcuda      usage: capture_probe [capture|timing]
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef unsigned long long ull;

__global__ void spin(ull ns, ull *start, ull *end) {
    ull t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    if (threadIdx.x == 0 && blockIdx.x == 0 && start) {
        *start = t0;
        *end = t;
    }
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static const char *name(CUresult r) {
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

enum { N_CALLS = 13 };
static const char *calls[N_CALLS] = {"none", "cuPointerGetAttribute(captured ptr)", "cuPointerGetAttribute(live ptr)",
                                     "cuMemPoolGetAttribute", "cuDeviceGetGraphMemAttribute", "cuStreamGetDevice",
                                     "cuStreamIsCapturing", "cuDeviceGetMemPool", "cuMemGetAllocationGranularity",
                                     "cuEventQuery(other event)", "cuEventCreate", "cuMemGetInfo",
                                     "cuEventRecord(capturing stream)+cuEventQuery"};

static CUresult call(int i, CUstream s, CUdeviceptr captured, CUdeviceptr live, CUmemoryPool pool, CUevent other) {
    cuuint64_t v;
    int o;
    CUdevice d;
    CUstreamCaptureStatus st;
    CUmemoryPool mp;
    size_t g, f, t;
    CUevent e;
    CUmemAllocationProp prop;
    switch (i) {
        case 0: return CUDA_SUCCESS;
        case 1: return cuPointerGetAttribute(&o, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, captured);
        case 2: return cuPointerGetAttribute(&o, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, live);
        case 3: return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
        case 4: return cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
        case 5: return cuStreamGetDevice(s, &d);
        case 6: return cuStreamIsCapturing(s, &st);
        case 7: return cuDeviceGetMemPool(&mp, 0);
        case 8:
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            return cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        case 9: return cuEventQuery(other);
        case 10: {
            CUresult r = cuEventCreate(&e, 0);
            if (r == CUDA_SUCCESS) cuEventDestroy(e);
            return r;
        }
        case 11: return cuMemGetInfo(&f, &t);
        default: {
            CUresult r = cuEventCreate(&e, 0);
            if (r == CUDA_SUCCESS) r = cuEventRecord(e, s);
            if (r == CUDA_SUCCESS) r = cuEventQuery(e);
            return r;
        }
    }
}

static void capture(void) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    CUmemoryPool pool;
    cuDeviceGetDefaultMemPool(&pool, 0);
    void *live;
    cudaMallocAsync(&live, 1 << 20, s); /* the pool in use, as PyTorch's async backend has it */
    cudaStreamSynchronize(s);
    CUevent other;
    cuEventCreate(&other, 0);
    cuEventRecord(other, (CUstream)s);
    cudaStreamSynchronize(s);
    const cudaStreamCaptureMode modes[2] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal};
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < N_CALLS; i++) {
            void *p = NULL;
            cudaGraph_t g = NULL;
            cudaError_t b = cudaStreamBeginCapture(s, modes[m]);
            cudaError_t a = cudaMallocAsync(&p, 64 << 20, s);
            CUresult r = call(i, (CUstream)s, (CUdeviceptr)p, (CUdeviceptr)live, pool, other);
            cudaError_t e = cudaStreamEndCapture(s, &g);
            printf("capture mode=%s call=\"%s\" begin=%s alloc=%s result=%s end=%s\n", m ? "thread-local" : "global",
                   calls[i], cudaGetErrorName(b), cudaGetErrorName(a), name(r), cudaGetErrorName(e));
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
        }
    }
}

static void timing(void) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    ull *se;
    cudaMalloc(&se, 2 * sizeof(ull));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const double us[3] = {5, 50, 5000};
    for (int k = 0; k < 3; k++) {
        double sum_el = 0, sum_k = 0;
        const int n = k == 2 ? 20 : 200;
        for (int i = 0; i < n; i++) {
            cudaEventRecord(a, s);
            spin<<<132, 32, 0, s>>>((ull)(us[k] * 1000), se, se + 1);
            cudaEventRecord(b, s);
            cudaEventSynchronize(b);
            float ms;
            cudaEventElapsedTime(&ms, a, b);
            ull h[2];
            cudaMemcpy(h, se, sizeof h, cudaMemcpyDeviceToHost);
            sum_el += ms * 1e6;
            sum_k += (double)(h[1] - h[0]);
        }
        printf("timing kernel_us=%.0f bracket_ns=%.0f kernel_ns=%.0f overhead_ns=%.0f\n", us[k], sum_el / n, sum_k / n,
               (sum_el - sum_k) / n);
    }
    /* An empty bracket, behind queued work and on an idle stream. */
    float ms;
    spin<<<132, 32, 0, s>>>(200000, NULL, NULL);
    cudaEventRecord(a, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    printf("timing empty_bracket_queued_ns=%.0f\n", ms * 1e6);
    cudaEventRecord(a, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    printf("timing empty_bracket_idle_ns=%.0f\n", ms * 1e6);
    /* Back-to-back kernels: the bracket around 100 of them against 100 kernels' own time. */
    cudaEventRecord(a, s);
    for (int i = 0; i < 100; i++) spin<<<132, 32, 0, s>>>(50000, NULL, NULL);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    printf("timing back_to_back_100x50us_ns=%.0f per_kernel_gap_ns=%.0f\n", ms * 1e6, (ms * 1e6 - 100 * 50000.0) / 100);
    /* Host cost of polling a completed and a pending event. */
    double t0 = now_ns();
    for (int i = 0; i < 10000; i++) cuEventQuery((CUevent)b);
    printf("timing event_query_done_ns=%.0f\n", (now_ns() - t0) / 10000);
    spin<<<132, 32, 0, s>>>(100000000, NULL, NULL);
    cudaEventRecord(b, s);
    t0 = now_ns();
    for (int i = 0; i < 10000; i++) cuEventQuery((CUevent)b);
    printf("timing event_query_pending_ns=%.0f\n", (now_ns() - t0) / 10000);
    t0 = now_ns();
    for (int i = 0; i < 10000; i++) cudaEventRecord(a, s);
    printf("timing event_record_host_ns=%.0f\n", (now_ns() - t0) / 10000);
    cudaStreamSynchronize(s);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    cudaFree(0);
    if (strcmp(what, "timing")) capture();
    if (strcmp(what, "capture")) timing();
    return 0;
}
