/*
 * Stream capture survives the limiter. What PyTorch does with backend:cudaMallocAsync and torch.cuda.graph:
 * the default pool is in use (it keeps what was freed), then a capture allocates from it, launches, and
 * ends; the graph is instantiated and launched. The capture must end as it does without the limiter, and
 * the graph's memory must be charged once it runs. Once per capture mode, and once with a global-mode
 * capture open in another thread while this thread allocates from the pool and synchronises (the
 * library's own pool reads must not invalidate that capture).
 *
 * usage: t_capture global|thread-local|relaxed|other-thread  (run with DRAGPU_MEMORY_LIMIT=1Gi and, to
 * throttle the captured launch too, DRAGPU_CORES_LIMIT)
 */
#include "device.h"
#include <pthread.h>

#define MiB (1024ull * 1024ull)
#define LIMIT (1024 * MiB)

uint64_t fakecuda_used_bytes(int device);

static uint64_t accounted(void) {
    size_t free_b, total;
    CHECK_CU(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    return total == LIMIT ? total - free_b : fakecuda_used_bytes(0); /* baseline: no limiter */
}

static CUfunction fn;

/* The pool in use: memory allocated and freed, kept by the pool (threshold: keep everything). */
static void use_pool(CUstream s) {
    CUmemoryPool pool;
    CHECK_CU(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    cuuint64_t keep = ~0ull;
    CHECK_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), CUDA_SUCCESS);
    CUdeviceptr p;
    CHECK_CU(cuMemAllocAsync(&p, 64 * MiB, s), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
}

static void capture_alloc(CUstream s, CUstreamCaptureMode mode) {
    uint64_t before = fakecuda_used_bytes(0);
    CUgraph g;
    CUgraphExec e;
    CUdeviceptr v;
    CHECK_CU(cuStreamBeginCapture_v2(s, mode), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&v, 256 * MiB, s), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    CHECK_CU(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(g != NULL, "the capture produced no graph");
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, s), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK(fakecuda_used_bytes(0) >= before + 256 * MiB, "the graph's allocation was not made");
    CHECK_EQ_U64(accounted(), fakecuda_used_bytes(0)); /* the graph's memory is charged */
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
}

static CUcontext ctx;
static CUstream other;
static pthread_barrier_t began, done;

/* Another thread's global-mode capture, open while the main thread works. */
static void *capturer(void *arg) {
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_CU(cuStreamBeginCapture_v2(other, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, other, NULL, NULL), CUDA_SUCCESS);
    pthread_barrier_wait(&began);
    pthread_barrier_wait(&done);
    CUgraph g;
    CHECK_CU(cuStreamEndCapture(other, &g), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: t_capture global|thread-local|relaxed|other-thread");
    ctx = use_device0();
    CUmodule mod;
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "k"), CUDA_SUCCESS);
    CUstream s;
    CHECK_CU(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    use_pool(s);
    if (!strcmp(argv[1], "global")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    else if (!strcmp(argv[1], "thread-local")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    else if (!strcmp(argv[1], "relaxed")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_RELAXED);
    else if (!strcmp(argv[1], "other-thread")) {
        /* This thread uses the pool while another captures in global mode: its own calls are the
         * application's business (a stream-ordered allocation and a stream's synchronisation are allowed
         * from a thread in thread-local mode); the library's reads of the pool must not break the capture. */
        CHECK_CU(cuStreamCreate(&other, 0), CUDA_SUCCESS);
        pthread_barrier_init(&began, NULL, 2);
        pthread_barrier_init(&done, NULL, 2);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, capturer, NULL) == 0, "pthread_create");
        pthread_barrier_wait(&began);
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
        for (int i = 0; i < 8; i++) {
            CUdeviceptr p;
            CHECK_CU(cuMemAllocAsync(&p, 96 * MiB, s), CUDA_SUCCESS);
            CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            CHECK_CU(cuMemFreeAsync(p, s), CUDA_SUCCESS);
            CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
        }
        CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
        pthread_barrier_wait(&done);
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        CHECK_EQ_U64(accounted(), fakecuda_used_bytes(0));
    } else {
        CHECK(0, "unknown scenario %s", argv[1]);
    }
    printf("t_capture %s: ok\n", argv[1]);
    return 0;
}
