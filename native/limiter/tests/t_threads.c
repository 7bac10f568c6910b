/*
 * Threads: eight threads make their first intercepted call at the same moment (lazy initialisation races),
 * then allocate and free concurrently against a 64 MiB limit they oversubscribe four times over, while
 * launching throttled kernels on their own streams. The driver's real usage must never exceed the limit,
 * every refusal must be CUDA_ERROR_OUT_OF_MEMORY, and at the end the claim's usage is back to zero.
 * Run with DRAGPU_MEMORY_LIMIT=64Mi and DRAGPU_CORES_LIMIT set (tests/run.sh).
 */
#include "device.h"
#include <pthread.h>

uint64_t fakecuda_used_bytes(int device);

#define THREADS 8
#define ROUNDS 4000
#define LIMIT (64 * MiB)

static CUcontext ctx;
static CUfunction fn;
static pthread_barrier_t start;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
    CUstream s;
    CUdeviceptr live[8] = {0};
    unsigned long refused = 0;
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    pthread_barrier_wait(&start);
    CHECK_CU(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    for (int i = 0; i < ROUNDS; i++) {
        seed = seed * 1103515245u + 12345u;
        int slot = (int)(seed >> 8) % 8;
        if (live[slot]) {
            CHECK_CU(cuMemFree_v2(live[slot]), CUDA_SUCCESS);
            live[slot] = 0;
        }
        size_t size = (size_t)(1 + (seed >> 12) % 4) * MiB;
        CUresult r = cuMemAlloc_v2(&live[slot], size);
        CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2 returned %d", (int)r);
        if (r != CUDA_SUCCESS) {
            live[slot] = 0;
            refused++;
        }
        CHECK(fakecuda_used_bytes(0) <= LIMIT, "the driver holds %llu bytes, over the limit",
              (unsigned long long)fakecuda_used_bytes(0));
        if (i % 16 == 0) CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    }
    for (int k = 0; k < 8; k++)
        if (live[k]) CHECK_CU(cuMemFree_v2(live[k]), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK_CU(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    return (void *)(uintptr_t)refused;
}

int main(void) {
    CUmodule mod;
    ctx = use_device0();
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "k"), CUDA_SUCCESS);
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) == 0, "pthread_create");
    unsigned long refused = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        refused += (unsigned long)(uintptr_t)r;
    }
    CHECK(refused > 0, "the threads never hit the limit; the test does not test it");
    size_t free_b, total;
    CHECK_CU(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK_EQ_U64(total, LIMIT);
    CHECK_EQ_U64(free_b, LIMIT);
    CHECK_EQ_U64(fakecuda_used_bytes(0), 0);
    printf("t_threads: ok (%d threads x %d allocations, %lu refused)\n", THREADS, ROUNDS, refused);
    return 0;
}
