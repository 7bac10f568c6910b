/*
 * Every way device memory comes to exist is charged, to the GPU it lands on. Two GPUs, a 1 GiB limit on
 * each; one scenario per run (argv[1]). After every step the claim's accounted usage of each GPU (what the
 * capped cuMemGetInfo_v2 reports as used) equals what the fake driver holds, and an allocation the claim
 * cannot afford is refused with CUDA_ERROR_OUT_OF_MEMORY without reaching the driver.
 *
 *   stream-device  stream-ordered allocations on a stream or pool of another device than the current one
 *   pool-kept      what pools keep after cuMemFreeAsync (release threshold) stays charged until trimmed
 *   graph          graph allocation nodes (cuGraphAddMemAllocNode, cuGraphAddNode) and the graph memory pool
 *   graph-legacy   graphs instantiated through the CUDA 10 and 11 ABI (cuGraphInstantiate, _v2), on every route
 *                  (dlsym, cuGetProcAddress at 10000 and 11000): charged at their first launch, refused over it
 *   capture        allocations during stream capture, freed by the capture: charged when the graph runs
 *   serving        what a serving engine does (gpucheck's serving checks, modelled): NCCL's host-located VMM
 *                  buffers (host and host-NUMA locations) are not charged; the memory-profiling sequence (free
 *                  memory before and after a warm-up and a capture that allocates) gives figures the cap
 *                  explains, and nine tenths of what it leaves free can be allocated as a cache; a KV cache
 *                  grown block by block stops at the cap, is freed and grows again
 *   legacy-abi     the CUDA 2.0 entry points cuGetProcAddress returns for version 2000
 *   granularity    many small allocations: charged whole granules, as the driver holds them
 *   contexts       primary and created contexts, cuCtxSetLimit: what their stack, heap and FIFO hold (run
 *                  with FAKE_CUDA_CTX_*_BYTES set; elsewhere contexts hold nothing)
 *   import         VMM memory imported from another process (another claim) through a shareable handle is
 *                  charged to the importer when mapped; importing its own export takes no second charge, and
 *                  released, it stays charged while the descriptor it was exported as is open
 *   ipc            legacy CUDA IPC memory opened from a process of another claim is charged to the importer
 *                  (refused over the limit) until its last cuIpcCloseMemHandle
 *   ipc-same-claim legacy CUDA IPC between two processes of one claim: charged once, for as long as either
 *                  holds it (the exporter's free, or its death, leaves it charged while it is open here;
 *                  an opener's death and the exporter's free give it all back)
 *   import-same-claim  the same for VMM memory shared through a POSIX descriptor, where the kernel can tell
 *                  that the importer's descriptor is the exporter's (kcmp); where kcmp is refused (seccomp),
 *                  the importer is charged as well: the claim gets less, never more
 *   export-churn   two processes of the claim, four threads each, allocating, exporting (IPC handle and VMM
 *                  descriptor) and freeing at once: nothing is left charged and the whole limit is free after
 */
#include "device.h"
#include "fake_common.h"
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuArrayCreate
#undef cuMemAllocPitch

unsigned long fakecuda_calls(const char *name);
uint64_t fakecuda_used_bytes(int device);

static const uint64_t LIMIT = 1 * GiB;
static CUcontext ctx[2];
static CUstream s0, s1; /* streams of device 0 and device 1 */

/* The claim's usage of a device as the limiter accounts it. */
static uint64_t accounted(int dev) {
    CUcontext prev;
    size_t free_b, total;
    CHECK_CU(cuCtxPushCurrent_v2(ctx[dev]), CUDA_SUCCESS);
    CHECK_CU(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK_CU(cuCtxPopCurrent_v2(&prev), CUDA_SUCCESS);
    CHECK_EQ_U64(total, LIMIT);
    return total - free_b;
}

/* The accounted sum of each device equals what the driver holds there. */
#define HOLDS(bytes0, bytes1)                                                                                          \
    do {                                                                                                               \
        CHECK_EQ_U64(fakecuda_used_bytes(0), bytes0);                                                                  \
        CHECK_EQ_U64(accounted(0), bytes0);                                                                            \
        CHECK_EQ_U64(fakecuda_used_bytes(1), bytes1);                                                                  \
        CHECK_EQ_U64(accounted(1), bytes1);                                                                            \
    } while (0)

/* Refused by the limiter: CUDA_ERROR_OUT_OF_MEMORY, and the driver's entry point was not called. */
#define REFUSED(call, fake_name)                                                                                       \
    do {                                                                                                               \
        unsigned long before_ = fakecuda_calls(fake_name);                                                             \
        CHECK_CU(call, CUDA_ERROR_OUT_OF_MEMORY);                                                                      \
        CHECK_EQ_U64(fakecuda_calls(fake_name), before_);                                                              \
    } while (0)

static void setup(void) {
    CUdevice d;
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        CHECK_CU(cuDeviceGet(&d, i), CUDA_SUCCESS);
        CHECK_CU(cuDevicePrimaryCtxRetain(&ctx[i], d), CUDA_SUCCESS);
    }
    CHECK_CU(cuCtxSetCurrent(ctx[1]), CUDA_SUCCESS);
    CHECK_CU(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
    CHECK_CU(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS); /* device 0 is current from here on */
    CHECK_CU(cuStreamCreate(&s0, 0), CUDA_SUCCESS);
}

static void stream_device(void) {
    CUdeviceptr p, q;
    CHECK_CU(cuMemAllocAsync(&p, 512 * MiB, s1), CUDA_SUCCESS);
    HOLDS(0, 512 * MiB);
    REFUSED(cuMemAllocAsync(&q, 600 * MiB, s1), "cuMemAllocAsync");
    CHECK_CU(cuMemAllocAsync(&q, 600 * MiB, NULL), CUDA_SUCCESS); /* device 0 has room */
    HOLDS(600 * MiB, 512 * MiB);
    CHECK_CU(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
    HOLDS(0, 512 * MiB);
    /* A pool of device 1 used from device 0's context and stream. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool pool1;
    CHECK_CU(cuMemPoolCreate(&pool1, &props), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocFromPoolAsync(&q, 256 * MiB, pool1, s0), CUDA_SUCCESS);
    HOLDS(0, 768 * MiB);
    REFUSED(cuMemAllocFromPoolAsync(&q, 300 * MiB, pool1, s0), "cuMemAllocFromPoolAsync");
    CHECK_CU(cuMemFreeAsync(q, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s1), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s1), CUDA_SUCCESS);
    CHECK_CU(cuMemPoolDestroy(pool1), CUDA_SUCCESS);
    HOLDS(0, 0);
}

static void pool_kept(void) {
    CUmemoryPool pool;
    CUdeviceptr p, q;
    CHECK_CU(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    cuuint64_t keep_all = UINT64_MAX, keep_none = 0;
    CHECK_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&p, 600 * MiB, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s0), CUDA_SUCCESS);
    HOLDS(600 * MiB, 0); /* freed, but the pool keeps it */
    REFUSED(cuMemAlloc_v2(&q, 500 * MiB), "cuMemAlloc_v2");
    CHECK_CU(cuMemAllocAsync(&p, 500 * MiB, s0), CUDA_SUCCESS); /* served from what the pool keeps */
    HOLDS(600 * MiB, 0);
    CHECK_CU(cuMemFreeAsync(p, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuMemAlloc_v2(&q, 500 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    /* The threshold back to 0: memory goes back at the next synchronisation. */
    CHECK_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_none), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&p, 700 * MiB, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s0), CUDA_SUCCESS);
    /* Refunded at the synchronisation itself: another process of the claim can have it at once. */
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) _exit(cuMemAlloc_v2(&q, 700 * MiB) == CUDA_SUCCESS ? 0 : 1);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "another process of the claim could not have what the pool gave back");
    HOLDS(0, 0);
    /* A pool of its own, keeping everything until destroyed. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool own;
    CHECK_CU(cuMemPoolCreate(&own, &props), CUDA_SUCCESS);
    CHECK_CU(cuMemPoolSetAttribute(own, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocFromPoolAsync(&p, 700 * MiB, own, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s0), CUDA_SUCCESS);
    CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
    HOLDS(700 * MiB, 0);
    REFUSED(cuMemAllocAsync(&q, 400 * MiB, s0), "cuMemAllocAsync");
    CHECK_CU(cuMemPoolDestroy(own), CUDA_SUCCESS);
    HOLDS(0, 0);
}

static CUDA_MEM_ALLOC_NODE_PARAMS alloc_params(size_t bytes) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    return p;
}

/* Both executable graphs and both graphs gone, the graph memory pool trimmed: nothing is held any more. */
static void destroy_two(CUgraphExec e, CUgraphExec e2, CUgraph g, CUgraph g2) {
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuGraphExecDestroy(e2), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g2), CUDA_SUCCESS);
}

static CUgraph graph_with_alloc(size_t bytes) {
    CUgraph g;
    CUgraphNode n;
    CUDA_MEM_ALLOC_NODE_PARAMS p = alloc_params(bytes);
    CHECK_CU(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p), CUDA_SUCCESS);
    return g;
}

static void graph_legacy(void) {
    PFN_cuGraphInstantiate_v11000 routes[4];
    CUdriverProcAddressQueryResult st;
    *(void **)&routes[0] = dlsym(RTLD_DEFAULT, "cuGraphInstantiate");
    *(void **)&routes[1] = dlsym(RTLD_DEFAULT, "cuGraphInstantiate_v2");
    CHECK_CU(cuGetProcAddress_v2("cuGraphInstantiate", (void **)&routes[2], 10000, 0, &st), CUDA_SUCCESS);
    CHECK_CU(cuGetProcAddress_v2("cuGraphInstantiate", (void **)&routes[3], 11000, 0, &st), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++) {
        CHECK(routes[i], "route %d: no cuGraphInstantiate", i);
        CUgraph g = graph_with_alloc(600 * MiB);
        CUgraphExec e;
        CUgraphNode err;
        char log[64];
        CHECK_CU(routes[i](&e, g, &err, log, sizeof log), CUDA_SUCCESS);
        CHECK_CU(cuGraphLaunch(e, s0), CUDA_SUCCESS);
        HOLDS(600 * MiB, 0);
        /* A second such graph cannot run beside it. */
        CUgraph g2 = graph_with_alloc(300 * MiB);
        CUgraphExec e2;
        CHECK_CU(routes[i](&e2, g2, &err, log, sizeof log), CUDA_SUCCESS);
        CUdeviceptr q;
        CHECK_CU(cuMemAlloc_v2(&q, 300 * MiB), CUDA_SUCCESS);
        REFUSED(cuGraphLaunch(e2, s0), "cuGraphLaunch");
        CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
        destroy_two(e, e2, g, g2);
    }
}

static void graph(void) {
    CUgraph g = graph_with_alloc(600 * MiB), g2;
    CUgraphExec e, e2;
    CUgraphNode n;
    HOLDS(0, 0); /* nothing is allocated before the graph runs */
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, s0), CUDA_SUCCESS);
    HOLDS(600 * MiB, 0);
    /* Allocation nodes the claim cannot afford now, added either way. */
    CHECK_CU(cuGraphCreate(&g2, 0), CUDA_SUCCESS);
    CUDA_MEM_ALLOC_NODE_PARAMS p = alloc_params(600 * MiB);
    REFUSED(cuGraphAddMemAllocNode(&n, g2, NULL, 0, &p), "cuGraphAddMemAllocNode");
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps = p.poolProps;
    np.alloc.bytesize = 600 * MiB;
    REFUSED(cuGraphAddNode_v2(&n, g2, NULL, NULL, 0, &np), "cuGraphAddNode_v2");
    CUdeviceptr q;
    REFUSED(cuMemAlloc_v2(&q, 500 * MiB), "cuMemAlloc_v2");
    /* Destroying the executable graph gives its memory to the graph memory pool, which keeps it. */
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    HOLDS(600 * MiB, 0);
    CHECK_CU(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    HOLDS(0, 0);
    /* Two graphs admitted while nothing is held: the second one's first launch is refused. */
    CHECK_CU(cuGraphAddNode_v2(&n, g2, NULL, NULL, 0, &np), CUDA_SUCCESS);
    CUgraph g3 = graph_with_alloc(600 * MiB);
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g3, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphInstantiateWithFlags(&e2, g2, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphUpload(e, s0), CUDA_SUCCESS);
    HOLDS(600 * MiB, 0);
    REFUSED(cuGraphLaunch(e2, s0), "cuGraphLaunch");
    HOLDS(600 * MiB, 0);
    CHECK_CU(cuGraphLaunch(e, s0), CUDA_SUCCESS); /* already uploaded: nothing more */
    HOLDS(600 * MiB, 0);
    destroy_two(e, e2, g, g2);
    CHECK_CU(cuGraphDestroy(g3), CUDA_SUCCESS);
}

static size_t free_now(void) {
    size_t f, t;
    CHECK_CU(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ_U64(t, LIMIT);
    return f;
}

static void serving(void) {
    /* NCCL: buffers in host memory through VMM, mapped for the device. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    CUmemGenericAllocationHandle host[2];
    CUdeviceptr va;
    CHECK_CU(cuMemAddressReserve(&va, 1024 * MiB, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        prop.location.type = i ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST;
        prop.location.id = 0;
        CHECK_CU(cuMemCreate(&host[i], 512 * MiB, &prop, 0), CUDA_SUCCESS);
        CHECK_CU(cuMemMap(va + (CUdeviceptr)i * 512 * MiB, 512 * MiB, 0, host[i], 0), CUDA_SUCCESS);
    }
    HOLDS(0, 0);
    for (int i = 0; i < 2; i++) {
        CHECK_CU(cuMemUnmap(va + (CUdeviceptr)i * 512 * MiB, 512 * MiB), CUDA_SUCCESS);
        CHECK_CU(cuMemRelease(host[i]), CUDA_SUCCESS);
    }
    /* Memory profiling: free before, a warm-up's allocations, a capture that allocates and runs, free after. */
    size_t before = free_now();
    CUdeviceptr weights, act, v;
    CHECK_CU(cuMemAlloc_v2(&weights, 200 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&act, 100 * MiB, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(act, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s0), CUDA_SUCCESS);
    size_t warm = free_now();
    CUgraph g;
    CUgraphExec e;
    CHECK_CU(cuStreamBeginCapture_v2(s0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&v, 64 * MiB, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(v, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamEndCapture(s0, &g), CUDA_SUCCESS);
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s0), CUDA_SUCCESS);
    size_t after = free_now();
    CHECK(before >= warm && warm >= after, "free rose: %zu -> %zu -> %zu", before, warm, after);
    CHECK_EQ_U64(LIMIT - after, fakecuda_used_bytes(0)); /* what is not free is what the driver holds */
    CUdeviceptr kv;
    CHECK_CU(cuMemAlloc_v2(&kv, after / 10 * 9 / (2 * MiB) * (2 * MiB)), CUDA_SUCCESS);
    REFUSED(cuMemAlloc_v2(&v, after / 10 * 2), "cuMemAlloc_v2");
    CHECK_CU(cuMemFree_v2(kv), CUDA_SUCCESS);
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    /* Decode: the KV cache grows a block at a time to the cap, is freed, and grows again as far. */
    enum { BLOCK = 16 * MiB, MOST = 1024 };
    static CUdeviceptr blocks[MOST];
    int reached[2];
    for (int round = 0; round < 2; round++) {
        int n = 0;
        while (n < MOST && cuMemAlloc_v2(&blocks[n], BLOCK) == CUDA_SUCCESS) n++;
        reached[round] = n;
        CHECK(n < MOST, "the cache never stopped");
        HOLDS(200 * MiB + (uint64_t)n * BLOCK, 0);
        while (n) CHECK_CU(cuMemFree_v2(blocks[--n]), CUDA_SUCCESS);
    }
    CHECK(reached[0] == reached[1] && (uint64_t)reached[0] * BLOCK > LIMIT - 200 * MiB - BLOCK,
          "the cache reached %d then %d blocks", reached[0], reached[1]);
    CHECK_CU(cuMemFree_v2(weights), CUDA_SUCCESS);
    HOLDS(0, 0);
}

static void capture(void) {
    CUgraph g;
    CUgraphExec e;
    CUdeviceptr v, q;
    CHECK_CU(cuStreamBeginCapture_v2(s0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&v, 600 * MiB, s0), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(v, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamEndCapture(s0, &g), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, s0), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s0), CUDA_SUCCESS);
    HOLDS(600 * MiB, 0); /* the graph memory pool keeps what the capture's allocation used */
    REFUSED(cuMemAlloc_v2(&q, 500 * MiB), "cuMemAlloc_v2");
    /* Over the limit during capture: refused, and the capture stays valid. */
    CHECK_CU(cuStreamBeginCapture_v2(s0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    REFUSED(cuMemAllocAsync(&v, 600 * MiB, s0), "cuMemAllocAsync");
    CUgraph g2;
    CHECK_CU(cuStreamEndCapture(s0, &g2), CUDA_SUCCESS);
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    HOLDS(0, 0);
}

/* The CUDA 2.0 ABI: 32-bit sizes and addresses. */
typedef CUresult (*alloc_v1)(unsigned int *, unsigned int);
typedef CUresult (*free_v1)(unsigned int);
typedef CUresult (*info_v1)(unsigned int *, unsigned int *);
typedef CUresult (*pitch_v1)(unsigned int *, unsigned int *, unsigned int, unsigned int, unsigned int);
struct desc_v1 {
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
};
typedef CUresult (*array_v1)(CUarray *, const struct desc_v1 *);

static void *lookup_v2000(const char *name) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK_CU(cuGetProcAddress_v2(name, &p, 2000, 0, &st), CUDA_SUCCESS);
    CHECK(p && st == CU_GET_PROC_ADDRESS_SUCCESS, "no %s at version 2000", name);
    return p;
}

static void legacy_abi(void) {
    alloc_v1 alloc = (alloc_v1)lookup_v2000("cuMemAlloc");
    free_v1 release = (free_v1)lookup_v2000("cuMemFree");
    info_v1 info = (info_v1)lookup_v2000("cuMemGetInfo");
    pitch_v1 pitch_alloc = (pitch_v1)lookup_v2000("cuMemAllocPitch");
    array_v1 array = (array_v1)lookup_v2000("cuArrayCreate");
    unsigned int p[4], q, pitch, free_b, total;
    for (int i = 0; i < 3; i++) CHECK_CU(alloc(&p[i], 256 * MiB), CUDA_SUCCESS);
    HOLDS(768 * MiB, 0);
    REFUSED(alloc(&q, 300 * MiB), "cuMemAlloc");
    CHECK_CU(info(&free_b, &total), CUDA_SUCCESS);
    CHECK_EQ_U64(total, LIMIT);
    CHECK_EQ_U64(free_b, 256 * MiB);
    REFUSED(pitch_alloc(&q, &pitch, 1024 * 1024, 300, 4), "cuMemAllocPitch");
    struct desc_v1 d = {.Width = 16384, .Height = 16384, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CUarray arr;
    REFUSED(array(&arr, &d), "cuArrayCreate");
    d.Width = d.Height = 4096; /* 64 MiB */
    CHECK_CU(array(&arr, &d), CUDA_SUCCESS);
    HOLDS(832 * MiB, 0);
    CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++) CHECK_CU(release(p[i]), CUDA_SUCCESS);
    HOLDS(0, 0);
}

static void granularity(void) {
    static CUdeviceptr p[600];
    int n = 0;
    while (n < 600 && cuMemAlloc_v2(&p[n], 1) == CUDA_SUCCESS) n++;
    CHECK_EQ_U64(n, LIMIT / (2 * MiB)); /* one 2 MiB granule each */
    HOLDS(LIMIT, 0);
    REFUSED(cuMemAlloc_v2(&p[n], 1), "cuMemAlloc_v2");
    for (int i = 0; i < n; i++) CHECK_CU(cuMemFree_v2(p[i]), CUDA_SUCCESS);
    HOLDS(0, 0);
}

static void contexts(void) {
    /* A context of the fake's limits (1 KiB stack x 132 SMs x 2048 threads, 8 MiB heap, 1 MiB FIFO): 273 MiB,
     * 274 MiB in whole granules, and what the driver takes besides (FAKE_CUDA_CTX_BYTES, measured by the
     * limiter as the drop in free memory, and kept through cuCtxSetLimit). */
    const uint64_t ctx_bytes = 274 * MiB + fake_context_bytes();
    CHECK(fake_context_bytes() % (2 * MiB) == 0 && fake_context_bytes() <= 16 * MiB,
          "run with FAKE_CUDA_CTX_BYTES a whole number of granules, 16 MiB at most");
    HOLDS(ctx_bytes, ctx_bytes); /* the two primary contexts */
    CUcontext c1, c2, c3;
    CHECK_CU(cuCtxCreate_v4(&c1, NULL, 0, 0), CUDA_SUCCESS);
    CHECK_CU(cuCtxCreate_v4(&c2, NULL, 0, 0), CUDA_SUCCESS); /* current from here */
    HOLDS(3 * ctx_bytes, ctx_bytes);
    CHECK_CU(cuCtxCreate_v4(&c3, NULL, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
    HOLDS(3 * ctx_bytes, ctx_bytes);
    REFUSED(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 256 * MiB), "cuCtxSetLimit");
    CHECK_CU(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 100 * MiB), CUDA_SUCCESS);
    HOLDS(3 * ctx_bytes + 92 * MiB, ctx_bytes);
    CHECK_CU(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0), CUDA_SUCCESS);
    HOLDS(3 * ctx_bytes + 92 * MiB - 2 * MiB, ctx_bytes); /* 273 + 92 - 1 MiB = 364 MiB, 182 granules */
    REFUSED(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048), "cuCtxSetLimit");
    CHECK_CU(cuCtxDestroy_v2(c2), CUDA_SUCCESS);
    CHECK_CU(cuCtxDestroy_v2(c1), CUDA_SUCCESS);
    HOLDS(ctx_bytes, ctx_bytes);
    /* The CUDA 2.0 entry points, as cuGetProcAddress returns them to a caller asking for version 2000. */
    typedef CUresult (*create_v1)(CUcontext *, unsigned int, CUdevice);
    typedef CUresult (*destroy_v1)(CUcontext);
    create_v1 create_old = (create_v1)lookup_v2000("cuCtxCreate");
    destroy_v1 destroy_old = (destroy_v1)lookup_v2000("cuCtxDestroy");
    CHECK_CU(create_old(&c1, 0, 0), CUDA_SUCCESS);
    HOLDS(2 * ctx_bytes, ctx_bytes);
    CHECK_CU(destroy_old(c1), CUDA_SUCCESS);
    HOLDS(ctx_bytes, ctx_bytes);
    /* The primary context goes with its last release, and comes back only if the claim can hold it. */
    CHECK_CU(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);
    CHECK_CU(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
    HOLDS(ctx_bytes, 0);
    CUdeviceptr p;
    CHECK_CU(cuMemAllocAsync(&p, 800 * MiB, s1), CUDA_SUCCESS);
    CUcontext again;
    CHECK_CU(cuDevicePrimaryCtxRetain(&again, 1), CUDA_ERROR_OUT_OF_MEMORY);
    HOLDS(ctx_bytes, 800 * MiB);
}

static CUmemAllocationProp device0_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

/* Sends a descriptor (SCM_RIGHTS) with one byte. */
static void send_fd(int sock, int fd) {
    char byte = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    CHECK(sendmsg(sock, &msg, 0) == 1, "sendmsg");
}

/* Makes a forked child a process of another claim (the environment is read again after fork): a state
 * directory `name` beside the parent's. */
static void join_another_claim(const char *name) {
    const char *parent = getenv("DRAGPU_LIMITER_STATE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", parent ? parent : "/tmp", name);
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    setenv("DRAGPU_LIMITER_STATE_DIR", dir, 1);
}

/* A process of another claim exports 512 MiB of device 0 and hands the descriptor over; it exits when told. */
static int exporter(int sock) {
    join_another_claim("exporter");
    CUmemAllocationProp prop = device0_prop();
    CUmemGenericAllocationHandle h;
    int fd;
    CHECK_CU(cuMemCreate(&h, 512 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    send_fd(sock, fd);
    char byte;
    CHECK(read(sock, &byte, 1) == 1, "read");
    return 0;
}

static int receive_fd(int sock) {
    char byte, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    CHECK(recvmsg(sock, &msg, 0) == 1, "recvmsg");
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    CHECK(c && c->cmsg_type == SCM_RIGHTS, "no descriptor received");
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void import(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) _exit(exporter(sv[1]));
    int fd = receive_fd(sv[0]);
    CUmemGenericAllocationHandle h;
    CHECK_CU(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    HOLDS(0, 0); /* not mapped here yet */
    CUdeviceptr va, q;
    CHECK_CU(cuMemAddressReserve(&va, 1 * GiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemAlloc_v2(&q, 600 * MiB), CUDA_SUCCESS);
    REFUSED(cuMemMap(va, 512 * MiB, 0, h, 0), "cuMemMap"); /* the importer's claim cannot hold it */
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va, 512 * MiB, 0, h, 0), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0);
    REFUSED(cuMemAlloc_v2(&q, 600 * MiB), "cuMemAlloc_v2");
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0); /* still mapped */
    CHECK_CU(cuMemUnmap(va, 512 * MiB), CUDA_SUCCESS);
    HOLDS(0, 0);
    char byte = 1;
    CHECK(write(sv[0], &byte, 1) == 1, "write");
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the exporter failed");
    close(fd);
    /* Its own allocation, exported and imported again: one allocation, one charge. */
    CUmemAllocationProp prop = device0_prop();
    CUmemGenericAllocationHandle own, again;
    CHECK_CU(cuMemCreate(&own, 256 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemImportFromShareableHandle(&again, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va, 256 * MiB, 0, again, 0), CUDA_SUCCESS);
    HOLDS(256 * MiB, 0);
    CHECK_CU(cuMemUnmap(va, 256 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(again), CUDA_SUCCESS);
    HOLDS(256 * MiB, 0);
    CHECK_CU(cuMemRelease(own), CUDA_SUCCESS);
    /* The descriptor it was exported as keeps it in the driver (the H100 record's vmm.after_release_all): it
     * stays charged until that is closed. */
    HOLDS(256 * MiB, 0);
    REFUSED(cuMemAlloc_v2(&q, 800 * MiB), "cuMemAlloc_v2");
    close(fd);
    HOLDS(0, 0);
}

/* A process of another claim allocates 512 MiB of device 0 with cuMemAlloc and hands its legacy IPC handle
 * over; it frees the memory and exits when told. */
static int ipc_exporter(int sock) {
    join_another_claim("ipc-exporter");
    CUdeviceptr p;
    CUipcMemHandle h;
    CHECK_CU(cuMemAlloc_v2(&p, 512 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    CHECK(write(sock, &h, sizeof h) == (ssize_t)sizeof h, "write");
    char byte;
    CHECK(read(sock, &byte, 1) == 1, "read");
    CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
    return 0;
}

static void ipc(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        close(sv[0]); /* the exporter sees the importer go, should a check fail there */
        _exit(ipc_exporter(sv[1]));
    }
    close(sv[1]);
    CUipcMemHandle h;
    CHECK(read(sv[0], &h, sizeof h) == (ssize_t)sizeof h, "read the handle");
    CUdeviceptr q, a = 0, b = 0;
    CHECK_CU(cuMemAlloc_v2(&q, 600 * MiB), CUDA_SUCCESS);
    /* The importer's claim cannot hold it: refused, and closed again (the driver holds nothing for it). */
    CHECK_CU(cuIpcOpenMemHandle_v2(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_OUT_OF_MEMORY);
    HOLDS(600 * MiB, 0);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    CHECK_CU(cuIpcOpenMemHandle_v2(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0);
    REFUSED(cuMemAlloc_v2(&q, 600 * MiB), "cuMemAlloc_v2");
    /* Opened again, through the CUDA 4.1 entry point: the same memory, one more reference, no second charge. */
    PFN_cuIpcOpenMemHandle_v4010 open_old = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK_CU(cuGetProcAddress_v2("cuIpcOpenMemHandle", (void **)&open_old, 4010, 0, &st), CUDA_SUCCESS);
    CHECK(open_old && st == CU_GET_PROC_ADDRESS_SUCCESS, "no cuIpcOpenMemHandle at version 4010");
    CHECK_CU(open_old(&b, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    CHECK(a == b, "a handle opened twice maps one address");
    HOLDS(512 * MiB, 0);
    CHECK_CU(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0); /* still open once */
    CHECK_CU(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuIpcCloseMemHandle(a), CUDA_ERROR_INVALID_VALUE);
    HOLDS(0, 0);
    char byte = 1;
    CHECK(write(sv[0], &byte, 1) == 1, "write");
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the exporter failed");
}

/* ---- two processes of one claim (the child keeps the state directory, so the region, of the parent) ---- */

#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

/* The claim's other process: on 'i' it allocates 512 MiB with cuMemAlloc and sends its IPC handle, on 'v' it
 * creates 512 MiB with cuMemCreate and sends a descriptor of it (closing its own, as senders do), on 'w' the
 * same with the allocation exported twice (the second descriptor is sent), on 'f' it
 * frees or releases that memory; each command is answered. It exits when the socket closes. */
static int claim_peer(int sock) {
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    char cmd;
    while (read(sock, &cmd, 1) == 1) {
        if (cmd == 'i') {
            CUipcMemHandle ih;
            CHECK_CU(cuMemAlloc_v2(&p, 512 * MiB), CUDA_SUCCESS);
            CHECK_CU(cuIpcGetMemHandle(&ih, p), CUDA_SUCCESS);
            CHECK_CU(cuIpcGetMemHandle(&ih, p), CUDA_SUCCESS); /* asked twice: still one charge */
            CHECK(write(sock, &ih, sizeof ih) == (ssize_t)sizeof ih, "write");
        } else if (cmd == 'v' || cmd == 'w') {
            CUmemAllocationProp prop = device0_prop();
            int fd;
            CHECK_CU(cuMemCreate(&h, 512 * MiB, &prop, 0), CUDA_SUCCESS);
            CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
            if (cmd == 'w') { /* exported again (one descriptor per peer, say): the second one is sent */
                close(fd);
                CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                         CUDA_SUCCESS);
            }
            send_fd(sock, fd);
            close(fd);
        } else if (cmd == 'f') {
            if (p) CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
            if (h) CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
            p = h = 0;
            CHECK(write(sock, &cmd, 1) == 1, "write");
        }
    }
    return 0;
}

static pid_t start_peer(int *sock) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        close(sv[0]);
        _exit(claim_peer(sv[1]));
    }
    close(sv[1]);
    *sock = sv[0];
    return pid;
}

static void ask(int sock, char cmd, void *reply, size_t n) {
    CHECK(write(sock, &cmd, 1) == 1, "write");
    CHECK(read(sock, reply, n) == (ssize_t)n, "no answer to '%c'", cmd);
}

static void stop_peer(pid_t pid, int sock, int kill_it) {
    if (kill_it) kill(pid, SIGKILL);
    close(sock);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(kill_it || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "the claim's other process failed");
}

#define CLAIM_HOLDS(bytes0) CHECK_EQ_U64(accounted(0), bytes0)

static void ipc_same_claim(void) {
    int sock;
    pid_t pid = start_peer(&sock);
    CUipcMemHandle h;
    CUdeviceptr a, q;
    ask(sock, 'i', &h, sizeof h);
    CLAIM_HOLDS(512 * MiB); /* the other process's charge, claim-wide */
    CHECK_CU(cuIpcOpenMemHandle_v2(&a, h, LAZY), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0);                                  /* open here too: one allocation, one charge */
    CHECK_CU(cuMemAlloc_v2(&q, 512 * MiB), CUDA_SUCCESS); /* the rest of the limit is still the claim's */
    CLAIM_HOLDS(1 * GiB);
    REFUSED(cuMemAlloc_v2(&q, 2 * MiB), "cuMemAlloc_v2");
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    /* The exporter frees it: the driver keeps the memory while it is open here, and the claim its charge. */
    char done;
    ask(sock, 'f', &done, 1);
    HOLDS(512 * MiB, 0);
    REFUSED(cuMemAlloc_v2(&q, 600 * MiB), "cuMemAlloc_v2");
    CHECK_CU(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
    HOLDS(0, 0);
    /* The exporter killed while the memory is open here: charged until it is closed. */
    ask(sock, 'i', &h, sizeof h);
    CHECK_CU(cuIpcOpenMemHandle_v2(&a, h, LAZY), CUDA_SUCCESS);
    stop_peer(pid, sock, 1);
    HOLDS(512 * MiB, 0);
    CHECK_CU(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
    HOLDS(0, 0);
    /* This process exports; another process of the claim opens it and is killed; the free gives all back. */
    CHECK_CU(cuMemAlloc_v2(&q, 512 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuIpcGetMemHandle(&h, q), CUDA_SUCCESS);
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        CUdeviceptr b;
        char ok = cuIpcOpenMemHandle_v2(&b, h, LAZY) == CUDA_SUCCESS;
        if (write(sv[1], &ok, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char opened = 0;
    CHECK(read(sv[0], &opened, 1) == 1 && opened, "the claim's other process could not open the memory");
    HOLDS(512 * MiB, 0);
    stop_peer(pid, sv[0], 1);
    close(sv[1]);
    HOLDS(512 * MiB, 0);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuMemAlloc_v2(&q, 1 * GiB), CUDA_SUCCESS); /* nothing left behind */
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
}

/* Whether seccomp or the kernel lets this process compare descriptors (kcmp): without it a VMM descriptor
 * cannot be proven to be another process's export, and is charged to the importer too. */
static int kcmp_allowed(void) { return syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0) == 0; }

static void import_same_claim(void) {
    int sock;
    pid_t pid = start_peer(&sock);
    const uint64_t mine = kcmp_allowed() ? 0 : 512 * MiB; /* what this process is charged for importing */
    CHECK(write(sock, "v", 1) == 1, "write");
    int fd = receive_fd(sock);
    CLAIM_HOLDS(512 * MiB);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va, q;
    CHECK_CU(cuMemAddressReserve(&va, 1 * GiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    close(fd);
    CHECK_CU(cuMemMap(va, 512 * MiB, 0, h, 0), CUDA_SUCCESS);
    CLAIM_HOLDS(512 * MiB + mine);
    if (mine) {
        CHECK_CU(cuMemUnmap(va, 512 * MiB), CUDA_SUCCESS);
        CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
        stop_peer(pid, sock, 0);
        HOLDS(0, 0);
        fprintf(stderr, "kcmp is not allowed here: VMM memory shared within the claim is charged to each holder\n");
        return;
    }
    CHECK_CU(cuMemAlloc_v2(&q, 512 * MiB), CUDA_SUCCESS);
    CLAIM_HOLDS(1 * GiB);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    /* The exporter releases its handle: mapped here, the memory and its charge stay. */
    char done;
    ask(sock, 'f', &done, 1);
    HOLDS(512 * MiB, 0);
    REFUSED(cuMemAlloc_v2(&q, 600 * MiB), "cuMemAlloc_v2");
    CHECK_CU(cuMemUnmap(va, 512 * MiB), CUDA_SUCCESS);
    CLAIM_HOLDS(512 * MiB); /* the imported handle still holds it */
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    HOLDS(0, 0);
    /* Exported twice, the second descriptor imported here; the exporter killed while it is. */
    CHECK(write(sock, "w", 1) == 1, "write");
    fd = receive_fd(sock);
    CHECK_CU(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             CUDA_SUCCESS);
    close(fd);
    stop_peer(pid, sock, 1);
    CLAIM_HOLDS(512 * MiB);
    CHECK_CU(cuMemMap(va, 512 * MiB, 0, h, 0), CUDA_SUCCESS);
    HOLDS(512 * MiB, 0);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_CU(cuMemUnmap(va, 512 * MiB), CUDA_SUCCESS);
    HOLDS(0, 0);
    CHECK_CU(cuMemAlloc_v2(&q, 1 * GiB), CUDA_SUCCESS); /* nothing left behind */
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
}

#define CHURN_THREADS 4
#define CHURN_ROUNDS 150

static void *churn(void *arg) {
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(ctx[0]), CUDA_SUCCESS);
    CUmemAllocationProp prop = device0_prop();
    for (int i = 0; i < CHURN_ROUNDS; i++) {
        CUdeviceptr p;
        CUipcMemHandle ih;
        CUmemGenericAllocationHandle h;
        int fd;
        /* Refusals are fine (the threads of both processes share the limit); leaks are not. */
        if (cuMemAlloc_v2(&p, 16 * MiB) == CUDA_SUCCESS) {
            CHECK_CU(cuIpcGetMemHandle(&ih, p), CUDA_SUCCESS);
            CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
        }
        if (cuMemCreate(&h, 32 * MiB, &prop, 0) == CUDA_SUCCESS) {
            CHECK_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
            close(fd);
            CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
        }
    }
    return NULL;
}

static void export_churn(void) {
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    pthread_t t[CHURN_THREADS];
    for (int i = 0; i < CHURN_THREADS; i++) CHECK(pthread_create(&t[i], NULL, churn, NULL) == 0, "pthread_create");
    for (int i = 0; i < CHURN_THREADS; i++) pthread_join(t[i], NULL);
    if (pid == 0) _exit(0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the claim's other process failed");
    HOLDS(0, 0);
    CUdeviceptr q;
    CHECK_CU(cuMemAlloc_v2(&q, 1 * GiB), CUDA_SUCCESS); /* the whole limit, nothing left behind */
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
}

/* As a container runtime's default seccomp profile does without CAP_SYS_PTRACE: kcmp fails with EPERM. */
static void refuse_kcmp(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_kcmp, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0,
          "seccomp");
}

/* The process imports its own export (the driver returns a new handle, which keeps the allocation) and
 * releases the original, never mapping the import: what the new handle keeps stays charged, so that
 * repeating it cannot hold more than the limit. With kcmp the import is proven to be the export (charged
 * once); without, it is charged at import as well (the claim pays twice while both handles live). */
static void import_unmapped(bool kcmp) {
    if (!kcmp) refuse_kcmp();
    CUmemAllocationProp prop = device0_prop();
    CUmemGenericAllocationHandle own[3], imported[3];
    int fd[3];
    for (int i = 0; i < 2; i++) {
        CHECK_CU(cuMemCreate(&own[i], 512 * MiB, &prop, 0), CUDA_SUCCESS);
        CHECK_CU(cuMemExportToShareableHandle(&fd[i], own[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_SUCCESS);
        if (!kcmp && i == 1) {
            /* 512 MiB kept by the first import, 512 MiB here: a second charge does not fit. */
            CHECK_CU(cuMemImportFromShareableHandle(&imported[i], (void *)(intptr_t)fd[i],
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     CUDA_ERROR_OUT_OF_MEMORY);
            CHECK_CU(cuMemRelease(own[i]), CUDA_SUCCESS);
            close(fd[i]);
            HOLDS(512 * MiB, 0);
            break;
        }
        CHECK_CU(cuMemImportFromShareableHandle(&imported[i], (void *)(intptr_t)fd[i],
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_SUCCESS);
        CHECK(imported[i] != own[i], "the driver returns a new handle per import");
        CHECK_EQ_U64(fakecuda_used_bytes(0), (uint64_t)(i + 1) * 512 * MiB);
        CHECK_EQ_U64(accounted(0), (uint64_t)(i + (kcmp ? 1 : 2)) * 512 * MiB);
        CHECK_CU(cuMemRelease(own[i]), CUDA_SUCCESS);
        /* The descriptor still open keeps the export charged (without kcmp the import is charged besides). */
        CHECK_EQ_U64(fakecuda_used_bytes(0), (uint64_t)(i + 1) * 512 * MiB);
        CHECK_EQ_U64(accounted(0), (uint64_t)(i + (kcmp ? 1 : 2)) * 512 * MiB);
        close(fd[i]);
        HOLDS((uint64_t)(i + 1) * 512 * MiB, 0); /* the import keeps it */
    }
    if (kcmp) {
        REFUSED(cuMemCreate(&own[2], 512 * MiB, &prop, 0), "cuMemCreate"); /* the limit is held by imports */
        CHECK_CU(cuMemRelease(imported[1]), CUDA_SUCCESS);
    }
    CHECK_CU(cuMemRelease(imported[0]), CUDA_SUCCESS);
    HOLDS(0, 0);
}
static void import_self(void) { import_unmapped(true); }
static void import_self_no_kcmp(void) { import_unmapped(false); }

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: t_paths <scenario>");
    static const struct {
        const char *name;
        void (*run)(void);
    } scenarios[] = {{"stream-device", stream_device},
                     {"pool-kept", pool_kept},
                     {"graph", graph},
                     {"graph-legacy", graph_legacy},
                     {"serving", serving},
                     {"capture", capture},
                     {"legacy-abi", legacy_abi},
                     {"granularity", granularity},
                     {"contexts", contexts},
                     {"import", import},
                     {"ipc", ipc},
                     {"ipc-same-claim", ipc_same_claim},
                     {"import-same-claim", import_same_claim},
                     {"export-churn", export_churn},
                     {"import-self", import_self},
                     {"import-self-no-kcmp", import_self_no_kcmp}};
    setup();
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (strcmp(argv[1], scenarios[i].name) != 0) continue;
        scenarios[i].run();
        printf("t_paths %s: ok\n", argv[1]);
        return 0;
    }
    CHECK(0, "unknown scenario %s", argv[1]);
}
