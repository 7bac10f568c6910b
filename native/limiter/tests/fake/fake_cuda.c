/*
 * A fake CUDA driver (libcuda.so.1) for testing the limiter on machines without a GPU.
 *
 * It stands in for NVIDIA's driver and keeps its semantics where the limiter depends on them:
 *   - it exports every driver entry point src/cuda_min.h declares (weak stubs returning CUDA_ERROR_NOT_SUPPORTED,
 *     generated from src/cuda_min.h), with real implementations for what the tests use;
 *   - cuGetProcAddress(_v2) resolves (base name, cudaVersion, flags) to the exact ABI variant from a
 *     static table of its own function pointers (never through dlsym), with the documented statuses:
 *     SYMBOL_NOT_FOUND / VERSION_NOT_SUFFICIENT with CUDA_SUCCESS and a NULL pointer, and
 *     CUDA_ERROR_INVALID_VALUE for a cudaVersion newer than the driver;
 *   - calls before cuInit fail with CUDA_ERROR_NOT_INITIALIZED, calls without a current context with
 *     CUDA_ERROR_INVALID_CONTEXT, allocations beyond the device's memory with CUDA_ERROR_OUT_OF_MEMORY;
 *   - device memory is accounted (cuMemGetInfo is truthful);
 *   - kernels take simulated time: launches return at once and queue on the device (all streams of a
 *     device run one after another), a launch blocks when 1024 are queued, events complete when the work
 *     queued before them has, and synchronisation sleeps until the device is idle. A kernel of B blocks
 *     runs ceil(B / SMs) waves of FAKE_CUDA_WAVE_NS each; a graph runs its kernel nodes back to back.
 *
 * Settings: see fake_common.h; FAKE_CUDA_GETPROC_LOG=<file> logs every cuGetProcAddress lookup. Extra exports for tests (not driver API): fakecuda_calls(name),
 * fakecuda_busy_ns(dev), fakecuda_used_bytes(dev), fakecuda_symbol(name).
 *
 * Built with -Bsymbolic so that the addresses it hands out are its own even when a preloaded library
 * exports the same names.
 */
#define _GNU_SOURCE
#include "cuda_min.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_common.h"
#include "fake_proctable.h"

/* cuda.h maps these base names to newer variants; the fake defines the exact old symbols too. */
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuEventElapsedTime
#undef cuDeviceGetUuid
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGraphInstantiate
#undef cuGraphAddNode
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle

#define EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------- call counters */

#define MAX_COUNTERS 256
static struct {
    const char *name;
    _Atomic unsigned long n;
} counters[MAX_COUNTERS];
static int n_counters;
static pthread_mutex_t counters_mu = PTHREAD_MUTEX_INITIALIZER;

static int counter_index(const char *name) {
    pthread_mutex_lock(&counters_mu);
    int i;
    for (i = 0; i < n_counters; i++) {
        if (strcmp(counters[i].name, name) == 0) break;
    }
    if (i == n_counters && n_counters < MAX_COUNTERS) counters[n_counters++].name = name;
    pthread_mutex_unlock(&counters_mu);
    return i < MAX_COUNTERS ? i : MAX_COUNTERS - 1;
}

#define COUNT()                                                                                                        \
    do {                                                                                                               \
        static _Atomic int idx_ = -1;                                                                                  \
        int i_ = atomic_load_explicit(&idx_, memory_order_relaxed);                                                    \
        if (i_ < 0) atomic_store(&idx_, i_ = counter_index(__func__));                                                 \
        atomic_fetch_add_explicit(&counters[i_].n, 1, memory_order_relaxed);                                           \
    } while (0)

/* An entry point that takes a stream, and its twin for the per-thread default stream (`_ptsz`), which the real
 * driver exports beside it: one body, each counted under its own name. */
#define TWINS(name, params, ...)                                                                                       \
    EXPORT CUresult name params {                                                                                      \
        COUNT();                                                                                                       \
        __VA_ARGS__                                                                                                    \
    }                                                                                                                  \
    EXPORT CUresult name##_ptsz params {                                                                               \
        COUNT();                                                                                                       \
        __VA_ARGS__                                                                                                    \
    }

EXPORT unsigned long fakecuda_calls(const char *name) {
    pthread_mutex_lock(&counters_mu);
    unsigned long n = 0;
    for (int i = 0; i < n_counters; i++) {
        if (strcmp(counters[i].name, name) == 0) n = counters[i].n;
    }
    pthread_mutex_unlock(&counters_mu);
    return n;
}

/* ---------------------------------------------------------------- objects */

#define MAGIC_CTX 0x43545831u
#define MAGIC_STREAM 0x53545231u
#define MAGIC_EVENT 0x45564e31u
#define MAGIC_FUNC 0x46554e31u
#define MAGIC_MOD 0x4d4f4431u
#define MAGIC_GRAPH 0x47524131u
#define MAGIC_EXEC 0x45584531u
#define MAGIC_POOL 0x504f4f31u
#define MAGIC_ARRAY 0x41525231u

/* A context holds device memory: FAKE_CUDA_CTX_BYTES of its own (the real driver's 549 MB by default) and
 * what its limits (cuCtxSetLimit) need: the stack of every thread the device can hold resident, the malloc
 * heap and the printf FIFO. gen is bumped when the context is destroyed. */
struct CUctx_st {
    unsigned magic;
    int device;
    unsigned gen;
    uint64_t stack, heap, fifo, reserved;
    int created;
};
struct CUstream_st {
    unsigned magic;
    int device;
    int capturing;
    CUgraph capture;
    int mode;
    unsigned gen;
    CUcontext ctx;
    pthread_t owner;
    int invalidated; /* the thread that began its capture; the capture is invalid */
};
struct CUevent_st {
    unsigned magic;
    int device;
    int recorded;
    uint64_t ts;
    struct CUctx_st *ctx;
    unsigned gen;
    int captured; /* last recorded into a capturing stream: a node of a graph, not a time */
};
struct CUmod_st {
    unsigned magic;
};
struct CUfunc_st {
    unsigned magic;
    char name[64];
};
/* Graph memory: what the graph's allocation nodes reserve (alloc_bytes) and what its free nodes give back
 * to the device's graph memory pool at the end of each launch (freed_bytes); one device per graph. */
struct CUgraph_st {
    unsigned magic;
    uint64_t duration_ns;
    unsigned nodes;
    int alloc_dev;
    uint64_t alloc_bytes, freed_bytes;
};
struct CUgraphExec_st {
    unsigned magic;
    int device;
    uint64_t duration_ns;
    int alloc_dev;
    uint64_t alloc_bytes, persist_bytes;
    int live;
};
/* A stream-ordered memory pool: reserved is what it holds from the device, in_use what is allocated from it;
 * above the release threshold, unused memory goes back to the device at synchronisation points. */
struct CUmemPoolHandle_st {
    unsigned magic;
    int device;
    uint64_t reserved, in_use, threshold;
};
struct CUarray_st {
    unsigned magic;
    int device;
    uint64_t bytes;
};
struct CUmipmappedArray_st {
    unsigned magic;
    int device;
    uint64_t bytes;
};

#define QUEUE_DEPTH 1024
#define THREADS_PER_SM 2048 /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR */

static struct device {
    struct CUctx_st primary;
    int primary_refs;
    struct CUmemPoolHandle_st pool;
    CUmemoryPool current_pool;     /* cuDeviceSetMemPool; NULL: the default pool */
    uint64_t gm_reserved, gm_used; /* the graph memory pool */
    uint64_t used;                 /* bytes allocated */
    uint64_t busy_until;           /* ns, CLOCK_MONOTONIC: when the queued work completes */
    uint64_t busy_total;           /* ns of kernel time ever queued */
    uint64_t queue_end[QUEUE_DEPTH];
    uint64_t queue_start[QUEUE_DEPTH]; /* when each queued kernel starts (after its launch latency) */
    unsigned queue_pos;
} devices[FAKE_MAX_DEVICES];

static struct {
    atomic_int initialized; /* the real driver may be asked from any thread while another initialises */
    int count;
    uint64_t memory, sms, wave_ns;
    int driver_version;
    int event_create_fails;
    int real_timing; /* FAKE_CUDA_REAL_TIMING: the H100's launch latency, event ticks and host costs */
    uint64_t neighbour_busy_ns, neighbour_period_ns; /* FAKE_CUDA_NEIGHBOUR_BUSY_US / _FREE_US */
    uint64_t ctx_stack, ctx_heap, ctx_fifo;          /* a new context's limits */
    uint64_t ctx_base;                               /* what a context holds besides its limits' memory */
} G;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth; /* ctx_stack[ctx_depth - 1] is current */

/* fork(): the child gets the device state with no lock held by a thread it does not have, as a real driver
 * answers a forked child's calls instead of hanging in them. */
static void fork_prepare(void) {
    pthread_mutex_lock(&mu); /* first: a holder of counters_mu waits for nothing */
    pthread_mutex_lock(&counters_mu);
}
static void fork_release(void) {
    pthread_mutex_unlock(&counters_mu);
    pthread_mutex_unlock(&mu);
}

static void load_config(void) {
    pthread_atfork(fork_prepare, fork_release, fork_release);
    G.count = fake_device_count();
    G.memory = fake_memory_bytes();
    G.sms = fake_env_u64("FAKE_CUDA_SM_COUNT", 132);
    if (G.sms == 0) G.sms = 1;
    G.wave_ns = fake_env_u64("FAKE_CUDA_WAVE_NS", 10000);
    G.driver_version = (int)fake_env_u64("FAKE_CUDA_DRIVER_VERSION", 13000);
    G.event_create_fails = fake_env_u64("FAKE_CUDA_EVENT_CREATE_FAILS", 0) != 0;
    G.real_timing = fake_env_u64("FAKE_CUDA_REAL_TIMING", 0) != 0;
    G.neighbour_busy_ns = fake_env_u64("FAKE_CUDA_NEIGHBOUR_BUSY_US", 0) * 1000;
    G.neighbour_period_ns =
        G.neighbour_busy_ns ? G.neighbour_busy_ns + fake_env_u64("FAKE_CUDA_NEIGHBOUR_FREE_US", 0) * 1000 : 0;
    G.ctx_stack = fake_env_u64("FAKE_CUDA_CTX_STACK_BYTES", 0);
    G.ctx_heap = fake_env_u64("FAKE_CUDA_CTX_HEAP_BYTES", 0);
    G.ctx_fifo = fake_env_u64("FAKE_CUDA_CTX_FIFO_BYTES", 0);
    G.ctx_base = fake_context_bytes();
    for (int i = 0; i < FAKE_MAX_DEVICES; i++) {
        devices[i].primary = (struct CUctx_st){.magic = MAGIC_CTX, .device = i};
        devices[i].pool = (struct CUmemPoolHandle_st){MAGIC_POOL, i, 0, 0, 0};
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    uint64_t now = now_ns();
    if (t <= now) return;
    struct timespec ts = {.tv_sec = (time_t)((t - now) / 1000000000ull), .tv_nsec = (long)((t - now) % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

static CUcontext current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* Common checks: initialised, and (if need_ctx) a current context. */
static CUresult check(int need_ctx) {
    pthread_once(&config_once, load_config);
    if (!G.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (need_ctx && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

#define CHECK(need_ctx)                                                                                                \
    do {                                                                                                               \
        CUresult e_ = check(need_ctx);                                                                                 \
        if (e_ != CUDA_SUCCESS) return e_;                                                                             \
    } while (0)

static int cur_device(void) { return current()->device; }

/* Stream capture rules (below, with cuThreadExchangeStreamCaptureMode). */
static int unsafe_call_invalidates(void);
static int waiting_on_capture_invalidates(int device);
static int unsafe_call_invalidates_locked(void);

static int valid_device(int d) { return d >= 0 && d < G.count; }

/* ---------------------------------------------------------------- allocation table */

/* A_HANDLE: physical memory from cuMemCreate; it is freed when its references (the handle's own, retains
 * and mappings) are all gone, as in the real driver. A_MAP: a mapping made by cuMemMap, keyed by address. */
/* A_POOLPTR: an allocation from a stream-ordered pool (handle: the pool); its memory is the pool's.
 * A_GRAPHVA: an address handed out by a graph allocation node or by a stream-ordered allocation during
 * capture (handle: the graph); its memory is the device's graph memory pool's. */
/* A_IPC: memory of another process opened with cuIpcOpenMemHandle (size: the exporting process, handle: its
 * address there, refs: opens not yet closed). */
enum { A_DEVICE = 1, A_HANDLE = 2, A_MAP = 3, A_POOLPTR = 4, A_GRAPHVA = 5, A_IPC = 6 };

/* The fake's allocation granularity: every allocation holds whole granules of device memory, as the real
 * driver hands out memory in pages (cuMemGetAllocationGranularity reports it). */
#define GRANULE (2ull << 20)
static uint64_t granules(uint64_t b) {
    return b > UINT64_MAX - GRANULE ? UINT64_MAX : (b + GRANULE - 1) / GRANULE * GRANULE;
}

struct alloc {
    uint64_t key;
    uint64_t bytes; /* device memory held (A_MAP: the mapping's size) */
    int device;
    int kind;        /* 0 empty, -1 tombstone */
    uint64_t size;   /* A_HANDLE: the allocation's size, whatever its location */
    uint64_t handle; /* A_MAP: the handle mapped */
    int refs;        /* A_HANDLE: the handle's own reference and retains (cuMemRelease drops one) */
    int maps;        /* A_HANDLE: mappings */
    uint64_t alias;  /* A_HANDLE: a handle imported in the exporting process: the allocation it refers to */
    uint64_t fd_dev; /* A_HANDLE exported as descriptors (memfds of one filesystem): their device and inodes */
    uint64_t fd_ino[4];
    int fd_held; /* A_HANDLE: released and unmapped, but a descriptor of it is still open here */
};
static struct alloc *allocs;
static size_t allocs_cap, allocs_used;
static uint64_t next_addr[FAKE_MAX_DEVICES];
static uint64_t next_handle = 1;

static size_t ahash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static struct alloc *alloc_find(uint64_t key, int kind) {
    if (!allocs_cap) return NULL;
    for (size_t i = ahash(key) & (allocs_cap - 1), n = 0; n < allocs_cap; n++, i = (i + 1) & (allocs_cap - 1)) {
        if (allocs[i].kind == 0) return NULL;
        if (allocs[i].kind == kind && allocs[i].key == key) return &allocs[i];
    }
    return NULL;
}

static int alloc_put(struct alloc a) {
    if ((allocs_used + 1) * 2 > allocs_cap) {
        size_t live = 0;
        for (size_t i = 0; i < allocs_cap; i++) live += allocs[i].kind > 0;
        size_t ncap = 1024;
        while (ncap < (live + 1) * 4) ncap *= 2;
        struct alloc *old = allocs, *nt = calloc(ncap, sizeof *nt);
        if (!nt) return -1;
        size_t ocap = allocs_cap;
        allocs = nt;
        allocs_cap = ncap;
        allocs_used = 0;
        for (size_t i = 0; i < ocap; i++) {
            if (old[i].kind > 0) alloc_put(old[i]);
        }
        free(old);
    }
    size_t i = ahash(a.key) & (allocs_cap - 1);
    while (allocs[i].kind > 0) i = (i + 1) & (allocs_cap - 1);
    if (allocs[i].kind == 0) allocs_used++;
    allocs[i] = a;
    return 0;
}

static int alloc_insert(uint64_t key, int kind, int device, uint64_t bytes) {
    return alloc_put((struct alloc){.key = key, .bytes = bytes, .device = device, .kind = kind});
}

static int addr_taken(uint64_t a) {
    return alloc_find(a, A_DEVICE) || alloc_find(a, A_POOLPTR) || alloc_find(a, A_GRAPHVA);
}

/* A fresh device address for bytes on a device; low: below 4 GiB, for the CUDA 2.0 (32-bit) ABI. Caller
 * holds mu. */
static uint64_t next_addr32 = 0;
static uint64_t new_addr(int device, uint64_t bytes, int low) {
    uint64_t span = (bytes + 511) & ~511ull, addr;
    if (low) {
        do {
            if (next_addr32 + span >= 0xc0000000ull) next_addr32 = 0;
            addr = 0x10000000ull + next_addr32;
            next_addr32 += span;
        } while (addr_taken(addr));
        return addr;
    }
    uint64_t base = 0x7f0000000000ull + ((uint64_t)device << 40);
    do {
        if (next_addr[device] + span >= (1ull << 39)) next_addr[device] = 0;
        addr = base + 0x200000 + next_addr[device];
        next_addr[device] += span;
    } while (addr_taken(addr));
    return addr;
}

/* Takes whole granules of a device's memory and returns a fresh device address. Caller holds mu. */
static CUresult device_alloc_at(int device, uint64_t bytes, int low, CUdeviceptr *out) {
    struct device *d = &devices[device];
    uint64_t held = granules(bytes);
    if (held > G.memory - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t addr = new_addr(device, bytes, low);
    if (alloc_insert(addr, A_DEVICE, device, held) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    d->used += held;
    *out = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

static CUresult device_alloc(int device, uint64_t bytes, CUdeviceptr *out) {
    return device_alloc_at(device, bytes, 0, out);
}

/* Frees what an address holds: device memory, a pool's allocation (back to the pool, which keeps it until
 * it releases at a synchronisation point), or a graph allocation (back to the graph memory pool; during
 * capture of the graph that made it, a free node). Caller holds mu. */
static CUresult device_free(uint64_t addr, int kind) {
    (void)kind;
    struct alloc *a = alloc_find(addr, A_DEVICE);
    if (a) {
        devices[a->device].used -= a->bytes;
        a->kind = -1;
        return CUDA_SUCCESS;
    }
    if ((a = alloc_find(addr, A_POOLPTR))) {
        CUmemoryPool pool = (CUmemoryPool)(uintptr_t)a->handle;
        pool->in_use -= a->bytes < pool->in_use ? a->bytes : pool->in_use;
        a->kind = -1;
        return CUDA_SUCCESS;
    }
    if ((a = alloc_find(addr, A_GRAPHVA))) {
        struct device *d = &devices[a->device];
        d->gm_used -= a->bytes < d->gm_used ? a->bytes : d->gm_used;
        a->kind = -1;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------------- stream-ordered pools */

#define MAX_POOLS 64
static CUmemoryPool created_pools[MAX_POOLS];

static CUmemoryPool device_pool(int device) {
    return devices[device].current_pool ? devices[device].current_pool : &devices[device].pool;
}

/* Gives a pool's unused memory back to the device down to keep (rounded up to whole granules, never below
 * what is allocated from it). Caller holds mu. */
static void pool_shrink(CUmemoryPool p, uint64_t keep) {
    keep = granules(keep);
    if (keep < granules(p->in_use)) keep = granules(p->in_use);
    if (p->reserved <= keep) return;
    devices[p->device].used -= p->reserved - keep;
    p->reserved = keep;
}

/* At a synchronisation point each pool of the device releases what it holds beyond its release threshold
 * (default 0: everything unused). Caller holds mu. */
static void pools_release(int device) {
    pool_shrink(&devices[device].pool, devices[device].pool.threshold);
    for (int i = 0; i < MAX_POOLS; i++) {
        CUmemoryPool p = created_pools[i];
        if (p && p->device == device) pool_shrink(p, p->threshold);
    }
}

/* An allocation from a pool: the pool grows by whole granules when what it keeps is not enough. Caller holds
 * mu. */
static CUresult pool_alloc(CUmemoryPool p, uint64_t bytes, CUdeviceptr *out) {
    if (bytes > UINT64_MAX - p->in_use) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t need = p->in_use + bytes;
    if (need > p->reserved) {
        uint64_t grow = granules(need - p->reserved);
        if (grow > G.memory - devices[p->device].used) return CUDA_ERROR_OUT_OF_MEMORY;
        devices[p->device].used += grow;
        p->reserved += grow;
    }
    uint64_t addr = new_addr(p->device, bytes, 0);
    if (alloc_put((struct alloc){
            .key = addr, .bytes = bytes, .device = p->device, .kind = A_POOLPTR, .handle = (uint64_t)(uintptr_t)p}) !=
        0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->in_use += bytes;
    *out = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

/* A graph allocation (a node, or a stream-ordered allocation during capture): an address now, memory when
 * the graph is launched. One device per graph in this fake. Caller holds mu. */
static CUresult graph_alloc(CUgraph g, int device, uint64_t bytes, CUdeviceptr *out) {
    if (g->alloc_bytes && g->alloc_dev != device) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t held = granules(bytes);
    uint64_t addr = new_addr(device, bytes, 0);
    if (alloc_put((struct alloc){
            .key = addr, .bytes = held, .device = device, .kind = A_GRAPHVA, .handle = (uint64_t)(uintptr_t)g}) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->alloc_dev = device;
    g->alloc_bytes += held;
    *out = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

/* A free node of graph g for an address its allocation nodes made. Caller holds mu. */
static CUresult graph_free(CUgraph g, uint64_t addr) {
    struct alloc *a = alloc_find(addr, A_GRAPHVA);
    if (!a || a->handle != (uint64_t)(uintptr_t)g) return CUDA_ERROR_INVALID_VALUE;
    g->freed_bytes += a->bytes;
    a->kind = -1;
    return CUDA_SUCCESS;
}

static void handle_settle(struct alloc *a);

/* Allocations kept only by a descriptor go once it is closed (the fake notices when asked). Caller holds mu. */
static void settle_descriptors(void) {
    for (size_t i = 0; i < allocs_cap; i++)
        if (allocs[i].kind == A_HANDLE && allocs[i].fd_held) handle_settle(&allocs[i]);
}

EXPORT uint64_t fakecuda_used_bytes(int device) {
    pthread_once(&config_once, load_config);
    if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
    pthread_mutex_lock(&mu);
    settle_descriptors();
    uint64_t u = devices[device].used;
    pthread_mutex_unlock(&mu);
    return u;
}

/* ---------------------------------------------------------------- simulated execution */

/* The real driver's timing (580, H100 and H200), as driver-facts.cu and bracket-facts.cu measured it:
 * tests/real-gpu/h100-driver-facts.txt (`timing.*`) and h200-bracket-facts.txt. With FAKE_CUDA_REAL_TIMING=1 the
 * fake follows them; otherwise a kernel starts the moment the device is free and calls take no time.
 *   - a kernel on an idle device starts LATENCY_IDLE_NS after its launch call returns (which takes the host
 *     HOST_LAUNCH_NS): events around it hold the launch's host time, 1931 ns and the kernel
 *     (bracket.idle.extra_ns);
 *   - a kernel queued behind another starts LATENCY_QUEUED_NS after it ends
 *     (timing.queued_50us_kernel_overhead_ns: ten kernels in one bracket, 2128 ns each);
 *   - an event recorded on an idle device is stamped when its record returns (two back to back measure
 *     the record's host time); one recorded behind work is stamped when that work ends and holds the device
 *     EVENT_QUEUED_NS: a bracket around each of a queue of kernels holds 2816 ns besides the kernel
 *     (bracket.queued.extra_ns), 688 more than a kernel queued without events;
 *   - event timestamps are multiples of EVENT_TICK_NS (timing.back_to_back_events_ns: 1280 and 1248);
 *   - the calling thread spends HOST_LAUNCH_NS in a launch, HOST_EVENT_RECORD_NS in cuEventRecord and
 *     HOST_EVENT_QUERY_NS in cuEventQuery (timing.launch_host_ns, event_record_host_ns,
 *     event_query_*_host_ns).
 * Busy time (fakecuda_busy_ns) is the kernels' own time: latencies are not in it. */
#define LATENCY_IDLE_NS 1930ull
#define LATENCY_QUEUED_NS 2128ull
#define EVENT_QUEUED_NS 688ull
#define EVENT_TICK_NS 32ull
#define HOST_LAUNCH_NS 4070ull
#define HOST_EVENT_RECORD_NS 1225ull
#define HOST_EVENT_QUERY_NS 280ull

/* Another process's context on the device (FAKE_CUDA_NEIGHBOUR_BUSY_US=b, FAKE_CUDA_NEIGHBOUR_FREE_US=f): it holds
 * the device for b us out of every b + f us, on the monotonic clock. A start event recorded onto an idle device
 * within such a window is reached only when the window ends, and what is queued behind it runs after it: the
 * real driver's behaviour with two contexts time-sliced (tests/real-gpu/bracket-facts.cu). Work already under way
 * is not preempted, and launches without an event before them are not held back (only brackets are compared
 * with the kernels they hold). */
static uint64_t after_neighbour(uint64_t t) {
    if (!G.neighbour_period_ns) return t;
    uint64_t in = t % G.neighbour_period_ns;
    return in < G.neighbour_busy_ns ? t - in + G.neighbour_busy_ns : t;
}

static void host_cost(uint64_t ns) {
    if (!G.real_timing) return;
    uint64_t until = now_ns() + ns;
    while (now_ns() < until) {}
}

static uint64_t kernel_ns(uint64_t blocks) {
    if (blocks == 0) blocks = 1;
    return (blocks + G.sms - 1) / G.sms * G.wave_ns;
}

/* A kernel's time: its waves, or for a function named "spin" the nanoseconds its first parameter (a uint64_t)
 * says - as a real kernel's time depends on its data, which neither the grid nor the function tells. */
static uint64_t launch_ns(CUfunction f, uint64_t blocks, void **params) {
    if (strcmp(f->name, "spin") == 0 && params && params[0]) return *(const uint64_t *)params[0];
    return kernel_ns(blocks);
}

/* Queues work of the given duration on a device; blocks while QUEUE_DEPTH launches are pending. */
static void enqueue(int device, uint64_t duration) {
    struct device *d = &devices[device];
    pthread_mutex_lock(&mu);
    uint64_t oldest = d->queue_end[d->queue_pos];
    while (oldest > now_ns()) {
        pthread_mutex_unlock(&mu);
        sleep_until(oldest);
        pthread_mutex_lock(&mu);
        oldest = d->queue_end[d->queue_pos];
    }
    uint64_t now = now_ns();
    uint64_t start = d->busy_until > now ? d->busy_until : now;
    if (G.real_timing) start += d->busy_until > now ? LATENCY_QUEUED_NS : LATENCY_IDLE_NS;
    d->busy_until = start + duration;
    d->busy_total += duration;
    d->queue_start[d->queue_pos] = start;
    d->queue_end[d->queue_pos] = d->busy_until;
    d->queue_pos = (d->queue_pos + 1) % QUEUE_DEPTH;
    pthread_mutex_unlock(&mu);
}

/* Device time spent executing kernels so far (queued work that has not run yet is not counted). */
EXPORT uint64_t fakecuda_busy_ns(int device) {
    pthread_once(&config_once, load_config);
    if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
    pthread_mutex_lock(&mu);
    uint64_t now = now_ns(), b = devices[device].busy_total;
    if (devices[device].busy_until > now) /* kernel time still to run: what is after now of each queued kernel */
        for (int i = 0; i < QUEUE_DEPTH; i++) {
            uint64_t st = devices[device].queue_start[i], en = devices[device].queue_end[i];
            if (en > now) b -= en - (st > now ? st : now);
        }
    pthread_mutex_unlock(&mu);
    return b;
}

static void wait_idle(int device) {
    pthread_mutex_lock(&mu);
    uint64_t t = devices[device].busy_until;
    pthread_mutex_unlock(&mu);
    sleep_until(t);
}

static int valid_stream(CUstream s) { return !s || s->magic == MAGIC_STREAM; }

/* A launch: executed, or recorded into the capturing stream's graph. */
/* A launch on a stream needs no current context (the stream has one; a CUkernel is context-less). */
static CUresult launch(CUfunction f, uint64_t blocks, void **params, CUstream s) {
    CHECK(!s);
    if (!f || f->magic != MAGIC_FUNC || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t duration = launch_ns(f, blocks, params);
    host_cost(HOST_LAUNCH_NS);
    if (s && s->capturing) {
        s->capture->duration_ns += duration;
        s->capture->nodes++;
        return CUDA_SUCCESS;
    }
    enqueue(s ? s->device : cur_device(), duration);
    return CUDA_SUCCESS;
}

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

/* ---------------------------------------------------------------- init, version, errors */

EXPORT CUresult cuInit(unsigned int flags) {
    COUNT();
    pthread_once(&config_once, load_config);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    G.initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    COUNT();
    pthread_once(&config_once, load_config);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = G.driver_version;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    COUNT();
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == e) {
            *s = errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    COUNT();
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == e) {
            *s = errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------------- cuGetProcAddress */

/* FAKE_CUDA_GETPROC_LOG=<file>: one line per lookup, "<name> <version> <flags> <symbol or ->". */
static FILE *getproc_log;
static void open_getproc_log(void) {
    const char *path = getenv("FAKE_CUDA_GETPROC_LOG");
    if (path && *path) getproc_log = fopen(path, "a");
}

static void log_lookup(const char *symbol, int version, cuuint64_t flags, const struct fake_proc_entry *pick) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, open_getproc_log);
    if (!getproc_log) return;
    fprintf(getproc_log, "%s %d %llu %s\n", symbol[0] ? symbol : "\"\"", version, (unsigned long long)flags,
            pick ? pick->symbol : "-");
    fflush(getproc_log);
}

static CUresult resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status) {
    pthread_once(&config_once, load_config);
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (version > G.driver_version) return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct fake_proc_entry *legacy = NULL, *ptsz = NULL;
    int known = 0;
    for (unsigned i = 0; i < fake_proc_table_len; i++) {
        const struct fake_proc_entry *e = &fake_proc_table[i];
        if (strcmp(e->base, symbol) != 0) continue;
        known = 1;
        if (e->version > version) continue;
        const struct fake_proc_entry **best = e->per_thread ? &ptsz : &legacy;
        if (!*best || e->version > (*best)->version) *best = e;
    }
    const struct fake_proc_entry *pick = per_thread && ptsz ? ptsz : legacy;
    log_lookup(symbol, version, flags, pick);
    *pfn = pick ? (void *)pick->fn : NULL;
    if (status)
        *status = pick    ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    COUNT();
    return resolve(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    COUNT();
    return resolve(symbol, pfn, version, flags, NULL);
}

/* The fake's own definition of an exact symbol (for benchmarks that bypass any interposer). */
EXPORT void *fakecuda_symbol(const char *name) {
    for (unsigned i = 0; i < fake_proc_table_len; i++) {
        if (strcmp(fake_proc_table[i].symbol, name) == 0) return (void *)fake_proc_table[i].fn;
    }
    return NULL;
}

/* ---------------------------------------------------------------- devices and contexts */

EXPORT CUresult cuDeviceGetCount(int *n) {
    COUNT();
    CHECK(0);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = G.count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    COUNT();
    CHECK(0);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            *v = (int)G.sms;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
            *v = THREADS_PER_SM;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            *v = 1024;
            break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            *v = 9;
            break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            *v = 0;
            break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            *v = 1;
            break;
        case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
            *v = 1;
            break;
        default:
            *v = 0;
    }
    return CUDA_SUCCESS;
}

static CUresult uuid(CUuuid *u, CUdevice d) {
    CHECK(0);
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(d, (unsigned char *)u->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    COUNT();
    return uuid(u, d);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    COUNT();
    return uuid(u, d);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)G.memory;
    return CUDA_SUCCESS;
}

static uint64_t ctx_bytes(uint64_t stack, uint64_t heap, uint64_t fifo) {
    return G.ctx_base + granules(stack * G.sms * THREADS_PER_SM + heap + fifo);
}

/* Takes a context's memory for limits (stack, heap, fifo): CUDA_ERROR_OUT_OF_MEMORY when the device cannot
 * hold it. Caller holds mu. */
static CUresult ctx_reserve(struct CUctx_st *c, uint64_t stack, uint64_t heap, uint64_t fifo) {
    uint64_t want = ctx_bytes(stack, heap, fifo);
    struct device *d = &devices[c->device];
    if (want > c->reserved && want - c->reserved > G.memory - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
    d->used = d->used + want - c->reserved;
    c->reserved = want;
    c->stack = stack;
    c->heap = heap;
    c->fifo = fifo;
    return CUDA_SUCCESS;
}

static void ctx_unreserve(struct CUctx_st *c) {
    devices[c->device].used -= c->reserved;
    c->reserved = 0;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    if (devices[d].primary_refs == 0) r = ctx_reserve(&devices[d].primary, G.ctx_stack, G.ctx_heap, G.ctx_fifo);
    if (r == CUDA_SUCCESS) devices[d].primary_refs++;
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS) *c = &devices[d].primary;
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    COUNT();
    CHECK(0);
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    ctx_unreserve(&devices[d].primary);
    devices[d].primary_refs = 0;
    devices[d].primary.gen++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, CUdevice d) {
    CHECK(0);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct CUctx_st){.magic = MAGIC_CTX, .device = d, .created = 1};
    pthread_mutex_lock(&mu);
    CUresult r = ctx_reserve(c, G.ctx_stack, G.ctx_heap, G.ctx_fifo);
    pthread_mutex_unlock(&mu);
    if (r != CUDA_SUCCESS) {
        free(c);
        return r;
    }
    ctx_stack[ctx_depth++] = c; /* pushed: current to this thread */
    *pctx = c;
    return CUDA_SUCCESS;
}

/* The CUDA 2.0 (cuCtxCreate, cuCtxDestroy) and 7.0 (primary context release and reset) variants behave as
 * their successors. */
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice d) {
    COUNT();
    (void)flags;
    return ctx_create(pctx, d);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d) {
    COUNT();
    (void)flags;
    return ctx_create(pctx, d);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice d) {
    COUNT();
    (void)params, (void)n, (void)flags;
    return ctx_create(pctx, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d) {
    COUNT();
    (void)params, (void)flags;
    return ctx_create(pctx, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    COUNT();
    CHECK(0);
    if (!c || c->magic != MAGIC_CTX || !c->created) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    ctx_unreserve(c);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < ctx_depth; i++) {
        if (ctx_stack[i] != c) continue;
        memmove(&ctx_stack[i], &ctx_stack[i + 1], (size_t)(ctx_depth - i - 1) * sizeof ctx_stack[0]);
        ctx_depth--;
        i--;
    }
    c->magic = 0;
    c->gen++; /* kept allocated: its events may still name it, and are invalid now */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext c) {
    COUNT();
    return cuCtxDestroy_v2(c);
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
    COUNT();
    return cuDevicePrimaryCtxRelease_v2(d);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) {
    COUNT();
    return cuDevicePrimaryCtxReset_v2(d);
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    COUNT();
    CHECK(1);
    struct CUctx_st *c = current();
    uint64_t stack = c->stack, heap = c->heap, fifo = c->fifo;
    switch (limit) {
        case CU_LIMIT_STACK_SIZE:
            stack = value;
            break;
        case CU_LIMIT_MALLOC_HEAP_SIZE:
            heap = value;
            break;
        case CU_LIMIT_PRINTF_FIFO_SIZE:
            fifo = value;
            break;
        default:
            return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&mu);
    CUresult r = ctx_reserve(c, stack, heap, fifo);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
    COUNT();
    CHECK(1);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = current();
    switch (limit) {
        case CU_LIMIT_STACK_SIZE:
            *value = (size_t)c->stack;
            return CUDA_SUCCESS;
        case CU_LIMIT_MALLOC_HEAP_SIZE:
            *value = (size_t)c->heap;
            return CUDA_SUCCESS;
        case CU_LIMIT_PRINTF_FIFO_SIZE:
            *value = (size_t)c->fifo;
            return CUDA_SUCCESS;
        default:
            return CUDA_ERROR_NOT_SUPPORTED;
    }
}

/* The last release destroys the primary context (its events with it); the next retain makes a new one at
 * the same address, as the driver may. */
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    COUNT();
    CHECK(0);
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (devices[d].primary_refs > 0 && --devices[d].primary_refs == 0) {
        ctx_unreserve(&devices[d].primary);
        devices[d].primary.gen++;
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    COUNT();
    CHECK(0);
    if (c && c->magic != MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (ctx_depth) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_depth) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    COUNT();
    CHECK(0);
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    COUNT();
    CHECK(0);
    if (!c || c->magic != MAGIC_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    COUNT();
    CHECK(1);
    CUcontext top = ctx_stack[--ctx_depth];
    if (c) *c = top;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    COUNT();
    CHECK(1);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = cur_device();
    return CUDA_SUCCESS;
}

static void release_pools_of(int device) {
    pthread_mutex_lock(&mu);
    pools_release(device);
    pthread_mutex_unlock(&mu);
}

EXPORT CUresult cuCtxSynchronize(void) {
    COUNT();
    CHECK(1);
    /* Waits for every stream of the context: a capturing one there is invalidated whatever its mode and
     * whichever thread asks (the record: also relaxed and another thread's thread-local capture). */
    int waited = waiting_on_capture_invalidates(cur_device());
    if (unsafe_call_invalidates() || waited) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_idle(cur_device());
    release_pools_of(cur_device());
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- memory */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    COUNT();
    CHECK(1);
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    settle_descriptors();
    *total = (size_t)G.memory;
    *free_bytes = (size_t)(G.memory - devices[cur_device()].used);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult alloc_on(int device, CUdeviceptr *p, size_t bytes) {
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = device_alloc(device, bytes, p);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    COUNT();
    CHECK(1);
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return alloc_on(cur_device(), p, bytes);
}

/* ---- the CUDA 2.0 ABI (32-bit sizes and addresses), which cuGetProcAddress returns for old versions */

EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int bytes) {
    COUNT();
    CHECK(1);
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d;
    pthread_mutex_lock(&mu);
    CUresult r = device_alloc_at(cur_device(), bytes, 1, &d);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS) *p = (unsigned int)d;
    return r;
}

EXPORT CUresult cuMemAllocPitch(unsigned int *p, unsigned int *pitch, unsigned int width, unsigned int height,
                                unsigned int elem) {
    COUNT();
    CHECK(1);
    if (!p || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t row = ((uint64_t)width + 255) / 256 * 256;
    CUdeviceptr d;
    pthread_mutex_lock(&mu);
    CUresult r = device_alloc_at(cur_device(), row * height, 1, &d);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS) {
        *p = (unsigned int)d;
        *pitch = (unsigned int)row;
    }
    return r;
}

EXPORT CUresult cuMemFree(unsigned int p) {
    COUNT();
    CHECK(1);
    if (!p) return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    CUresult r = device_free(p, A_DEVICE);
    pthread_mutex_unlock(&mu);
    return r;
}

static unsigned int clamp32(uint64_t v) { return v > 0xffffffffull ? 0xffffffffu : (unsigned int)v; }

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    COUNT();
    CHECK(1);
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *total = clamp32(G.memory);
    *free_bytes = clamp32(G.memory - devices[cur_device()].used);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = clamp32(G.memory);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned int flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    return alloc_on(cur_device(), p, bytes);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    COUNT();
    CHECK(1);
    if (!p || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + 255) / 256 * 256; /* this fake's pitch alignment: 256 bytes */
    CUresult r = alloc_on(cur_device(), p, row * height);
    if (r == CUDA_SUCCESS) *pitch = row;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    COUNT();
    CHECK(1);
    if (!p) return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    CUresult r = device_free(p, A_DEVICE);
    pthread_mutex_unlock(&mu);
    return r;
}

static int stream_device(CUstream s) { return s ? s->device : cur_device(); }

/* A stream-ordered allocation: from the pool, or, on a capturing stream, a graph allocation of the capture
 * (a pool's memory must be on the stream's device... this fake allows any pool, as peers with access do). */
static CUresult alloc_async(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    CHECK(1);
    if (!valid_stream(s) || (pool && pool->magic != MAGIC_POOL)) return CUDA_ERROR_INVALID_HANDLE;
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (s && s->capturing && s->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; /* the real log */
    pthread_mutex_lock(&mu);
    if (!pool) pool = device_pool(stream_device(s));
    CUresult r = s && s->capturing ? graph_alloc(s->capture, pool->device, bytes, p) : pool_alloc(pool, bytes, p);
    pthread_mutex_unlock(&mu);
    return r;
}

TWINS(cuMemAllocAsync, (CUdeviceptr * p, size_t bytes, CUstream s), return alloc_async(p, bytes, NULL, s);)

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *pool = &devices[d].pool;
    return CUDA_SUCCESS;
}

TWINS(cuMemAllocFromPoolAsync, (CUdeviceptr * p, size_t bytes, CUmemoryPool pool, CUstream s),
      if (!pool) return CUDA_ERROR_INVALID_HANDLE;
      return alloc_async(p, bytes, pool, s);)

static CUresult free_async(CUdeviceptr p, CUstream s) {
    CHECK(1);
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    CUresult r = s && s->capturing && alloc_find(p, A_GRAPHVA) ? graph_free(s->capture, p) : device_free(p, A_DEVICE);
    pthread_mutex_unlock(&mu);
    return r;
}

TWINS(cuMemFreeAsync, (CUdeviceptr p, CUstream s), return free_async(p, s);)

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    COUNT();
    CHECK(0);
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    *pool = device_pool(d);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
    COUNT();
    CHECK(0);
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->magic != MAGIC_POOL || pool->device != d) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    devices[d].current_pool = pool;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    COUNT();
    CHECK(0);
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct CUmemPoolHandle_st){MAGIC_POOL, props->location.id, 0, 0, 0};
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < MAX_POOLS && created_pools[i]) i++;
    if (i < MAX_POOLS) created_pools[i] = p;
    pthread_mutex_unlock(&mu);
    if (i == MAX_POOLS) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pool = p;
    return CUDA_SUCCESS;
}

/* The pool's memory goes back to the device (allocations still out keep their addresses, not its memory:
 * a simplification; the real driver defers until they are freed). The handle stays readable. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    COUNT();
    CHECK(0);
    if (!pool || pool->magic != MAGIC_POOL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < MAX_POOLS; i++) {
        if (created_pools[i] != pool) continue;
        created_pools[i] = NULL;
        devices[pool->device].used -= pool->reserved;
        if (devices[pool->device].current_pool == pool) devices[pool->device].current_pool = NULL;
        pool->reserved = pool->in_use = 0;
        pool->magic = 0;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    COUNT();
    CHECK(0);
    if (!pool || pool->magic != MAGIC_POOL) return CUDA_ERROR_INVALID_VALUE;
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    pool_shrink(pool, keep);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    COUNT();
    CHECK(0);
    if (!pool || pool->magic != MAGIC_POOL || !value) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            pthread_mutex_lock(&mu);
            pool->threshold = *(cuuint64_t *)value;
            pthread_mutex_unlock(&mu);
            return CUDA_SUCCESS;
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            return CUDA_SUCCESS;
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    COUNT();
    CHECK(0);
    if (!pool || pool->magic != MAGIC_POOL || !value) return CUDA_ERROR_INVALID_VALUE;
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            *(cuuint64_t *)value = pool->threshold;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)value = pool->reserved;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = pool->in_use;
            break;
        default:
            r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static int addr_device(uint64_t addr) {
    struct alloc *a = alloc_find(addr, A_DEVICE);
    if (!a) a = alloc_find(addr, A_POOLPTR);
    if (!a) a = alloc_find(addr, A_GRAPHVA);
    if (!a) a = alloc_find(addr, A_IPC);
    return a ? a->device : -1;
}

/* Only CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, for the addresses allocations returned. */
EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
    COUNT();
    CHECK(0);
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE) { /* for the base addresses of cuMemAlloc and IPC memory */
        pthread_mutex_lock(&mu);
        struct alloc *a = alloc_find(ptr, A_DEVICE);
        if (!a) a = alloc_find(ptr, A_IPC);
        size_t size = a ? a->bytes : 0;
        pthread_mutex_unlock(&mu);
        if (!a) return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = size;
        return CUDA_SUCCESS;
    }
    if (attr != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    int d = addr_device(ptr);
    pthread_mutex_unlock(&mu);
    if (d < 0) return CUDA_ERROR_INVALID_VALUE;
    *(int *)data = d;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!h || !prop || size == 0 || flags != 0 || size % (2u << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
    int device = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        device = prop->location.id;
    }
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    uint64_t key = next_handle++;
    if (device >= 0) {
        if (size > G.memory - devices[device].used) r = CUDA_ERROR_OUT_OF_MEMORY;
        else devices[device].used += size;
    }
    if (r == CUDA_SUCCESS) {
        alloc_put((struct alloc){.key = key,
                                 .bytes = device < 0 ? 0 : size,
                                 .device = device < 0 ? 0 : device,
                                 .kind = A_HANDLE,
                                 .size = size,
                                 .refs = 1});
        *h = key;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* Shareable handles (POSIX file descriptors): the descriptor is a memfd naming the allocation (the exporting
 * process, its handle, device and size). Imported in the exporting process, it is the same allocation
 * (the real driver returns a new handle per import, even here: one more reference to the allocation, held
 * until the new handle is released and unmapped); imported in another process, this fake accounts the allocation's memory to the
 * importing process's device as well, from its first mapping there (handle = 1 until then), so that each
 * process's view holds what it uses. */
struct shared_alloc {
    int pid;
    uint64_t handle;
    int device;
    uint64_t size;
};

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                             unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    struct shared_alloc sa = {getpid(), h, a ? a->device : 0, a ? a->size : 0};
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fake-cuda-shareable", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct stat st;
    if (write(fd, &sa, sizeof sa) != (ssize_t)sizeof sa || fstat(fd, &st) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&mu);
    a = alloc_find(h, A_HANDLE);
    for (int i = 0; a && i < 4; i++)
        if (!a->fd_ino[i]) {
            a->fd_dev = (uint64_t)st.st_dev;
            a->fd_ino[i] = (uint64_t)st.st_ino;
            break;
        }
    pthread_mutex_unlock(&mu);
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                               CUmemAllocationHandleType type) {
    COUNT();
    CHECK(0);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    struct shared_alloc sa;
    int fd = (int)(intptr_t)os_handle;
    if (pread(fd, &sa, sizeof sa, 0) != (ssize_t)sizeof sa) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(sa.device)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    struct alloc *a = sa.pid == getpid() ? alloc_find(sa.handle, A_HANDLE) : NULL;
    if (a) {
        a->refs++;
        uint64_t key = next_handle++;
        if (alloc_put((struct alloc){
                .key = key, .device = sa.device, .kind = A_HANDLE, .size = sa.size, .refs = 1, .alias = sa.handle}) !=
            0) {
            alloc_find(sa.handle, A_HANDLE)->refs--;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *h = key;
        }
    } else if (sa.pid == getpid()) {
        r = CUDA_ERROR_INVALID_VALUE; /* released since */
    } else {
        uint64_t key = next_handle++;
        alloc_put((struct alloc){
            .key = key, .bytes = 0, .device = sa.device, .kind = A_HANDLE, .size = sa.size, .refs = 1, .handle = 1});
        *h = key;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* Legacy CUDA IPC: the handle names the exporting process, the cuMemAlloc address there, its device and
 * size. Opened in another process, this fake accounts the memory to the importing process's device as well
 * (as for shareable handles), until its last cuIpcCloseMemHandle; opening a handle already open returns the
 * same address with one more reference; the exporting process cannot open its own handle. */
struct ipc_handle {
    uint64_t magic;
    int pid;
    int device;
    uint64_t addr;
    uint64_t bytes;
};
#define IPC_MAGIC 0x4350496b616b6646ull

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    COUNT();
    CHECK(1);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(p, A_DEVICE);
    struct ipc_handle ih = {IPC_MAGIC, getpid(), a ? a->device : 0, p, a ? a->bytes : 0};
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &ih, sizeof ih);
    return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    CHECK(1);
    if (!p || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle ih;
    memcpy(&ih, h.reserved, sizeof ih);
    if (ih.magic != IPC_MAGIC || !valid_device(ih.device)) return CUDA_ERROR_INVALID_HANDLE;
    if (ih.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    struct alloc *open = NULL;
    for (size_t i = 0; i < allocs_cap && !open; i++)
        if (allocs[i].kind == A_IPC && allocs[i].size == (uint64_t)ih.pid && allocs[i].handle == ih.addr)
            open = &allocs[i];
    if (open) {
        open->refs++;
        *p = open->key;
    } else {
        uint64_t addr = new_addr(ih.device, ih.bytes, 0);
        if (alloc_put((struct alloc){.key = addr,
                                     .bytes = ih.bytes,
                                     .device = ih.device,
                                     .kind = A_IPC,
                                     .size = (uint64_t)ih.pid,
                                     .handle = ih.addr,
                                     .refs = 1}) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            devices[ih.device].used += ih.bytes;
            *p = addr;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    COUNT();
    return ipc_open(p, h, flags);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    COUNT();
    return ipc_open(p, h, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    COUNT();
    CHECK(1);
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(p, A_IPC);
    if (a && --a->refs == 0) {
        devices[a->device].used -= a->bytes;
        a->kind = -1;
    }
    pthread_mutex_unlock(&mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    COUNT();
    CHECK(0);
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    int device = a ? a->device : 0, on_device = a && (a->bytes || a->handle == 1 || a->alias);
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = on_device ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    prop->location.id = on_device ? device : 0;
    return CUDA_SUCCESS;
}

/* Frees a handle's memory once nothing refers to it any more. Caller holds mu. */
/* Whether this process still has a descriptor the allocation was exported as open: as the real driver (the
 * H100 record's vmm.after_release_all), such a descriptor keeps the memory after the last handle is released. */
static int descriptor_open(const struct alloc *a) {
    if (!a->fd_ino[0]) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int open_ = 0;
    struct dirent *e;
    while (!open_ && (e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || (uint64_t)st.st_dev != a->fd_dev) continue;
        for (int i = 0; i < 4; i++)
            if (a->fd_ino[i] && (uint64_t)st.st_ino == a->fd_ino[i]) open_ = 1;
    }
    closedir(d);
    return open_;
}

static void handle_settle(struct alloc *a) {
    if (a->refs > 0 || a->maps > 0) return;
    if (descriptor_open(a)) {
        a->fd_held = 1;
        return;
    }
    a->fd_held = 0;
    devices[a->device].used -= a->bytes;
    a->kind = -1;
    struct alloc *of = a->alias ? alloc_find(a->alias, A_HANDLE) : NULL;
    if (of) {
        of->refs--;
        handle_settle(of);
    }
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    COUNT();
    CHECK(0);
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    CUresult r = a && a->refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        a->refs--;
        handle_settle(a);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static uint64_t next_va = 0x600000000000ull;

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    COUNT();
    CHECK(0);
    (void)alignment;
    (void)addr;
    if (!ptr || size == 0 || flags != 0 || size % (2u << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *ptr = (CUdeviceptr)next_va;
    next_va += size + (2u << 20); /* a guard gap: reservations never touch */
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    COUNT();
    CHECK(0);
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!ptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->refs == 0 || offset > a->size || size > a->size - offset || alloc_find(ptr, A_MAP))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && alloc_put((struct alloc){.key = ptr, .bytes = size, .kind = A_MAP, .handle = h}) != 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        a = alloc_find(h, A_HANDLE); /* found again: the insert may have rehashed */
        a->maps++;
        if (a->handle == 1) { /* imported from another process: its memory counts here from now on */
            a->handle = 0;
            a->bytes = a->size;
            devices[a->device].used += a->size;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* The range must be whole mappings, back to back; anything else is refused and nothing is unmapped. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    COUNT();
    CHECK(0);
    pthread_mutex_lock(&mu);
    uint64_t va = ptr;
    while (va - ptr < size) {
        struct alloc *m = alloc_find(va, A_MAP);
        if (!m) break;
        va += m->bytes;
    }
    CUresult r = ptr && size && va - ptr == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (va = ptr; r == CUDA_SUCCESS && va - ptr < size;) {
        struct alloc *m = alloc_find(va, A_MAP);
        struct alloc *a = alloc_find(m->handle, A_HANDLE);
        va += m->bytes;
        m->kind = -1;
        a->maps--;
        handle_settle(a);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    COUNT();
    CHECK(0);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < allocs_cap; i++) {
        struct alloc *m = &allocs[i];
        if (m->kind != A_MAP || (uint64_t)(uintptr_t)addr - m->key >= m->bytes) continue;
        alloc_find(m->handle, A_HANDLE)->refs++;
        *h = m->handle;
        r = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned channels) {
    return (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * 4;
}

/* Sparse and deferred-mapping arrays get no memory of their own (it is mapped in later). */
static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (d->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) return 0;
    return array_bytes(d->Width, d->Height, d->Depth, d->NumChannels);
}

static CUresult array_create(CUarray *out, uint64_t bytes) {
    CHECK(1);
    struct CUarray_st *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    int dev = cur_device();
    bytes = granules(bytes);
    CUresult r = bytes > G.memory - devices[dev].used ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) devices[dev].used += bytes;
    pthread_mutex_unlock(&mu);
    if (r != CUDA_SUCCESS) {
        free(a);
        return r;
    }
    *a = (struct CUarray_st){MAGIC_ARRAY, dev, bytes};
    *out = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *out, const CUDA_ARRAY_DESCRIPTOR *d) {
    COUNT();
    if (!out || !d || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_create(out, array_bytes(d->Width, d->Height, 1, d->NumChannels));
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *out, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    COUNT();
    if (!out || !d || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_create(out, array3d_bytes(d));
}

/* The CUDA 2.0 descriptors (32-bit sizes). */
struct fake_array_desc_v1 {
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
};
struct fake_array3d_desc_v1 {
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
};

EXPORT CUresult cuArrayCreate(CUarray *out, const struct fake_array_desc_v1 *d) {
    COUNT();
    if (!out || !d || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_create(out, array_bytes(d->Width, d->Height, 1, d->NumChannels));
}

EXPORT CUresult cuArray3DCreate(CUarray *out, const struct fake_array3d_desc_v1 *d) {
    COUNT();
    if (!out || !d || d->Width == 0) return CUDA_ERROR_INVALID_VALUE;
    if (d->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) return array_create(out, 0);
    return array_create(out, array_bytes(d->Width, d->Height, d->Depth, d->NumChannels));
}

EXPORT CUresult cuArrayDestroy(CUarray a) {
    COUNT();
    CHECK(0);
    if (!a || a->magic != MAGIC_ARRAY) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    devices[a->device].used -= a->bytes;
    pthread_mutex_unlock(&mu);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    COUNT();
    if (!out || !d || d->Width == 0 || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    CUarray a;
    CUresult r = array_create(&a, array3d_bytes(d) * 2);
    if (r == CUDA_SUCCESS) *out = (CUmipmappedArray)a; /* same layout: magic, device, bytes */
    return r;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    COUNT();
    return cuArrayDestroy((CUarray)m);
}

/* ---------------------------------------------------------------- modules and launches */

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    COUNT();
    CHECK(1);
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    mod->magic = MAGIC_MOD;
    *m = mod;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    COUNT();
    CHECK(1);
    if (!f || !m || m->magic != MAGIC_MOD || !name) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *fn = calloc(1, sizeof *fn);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    fn->magic = MAGIC_FUNC;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    *f = fn;
    return CUDA_SUCCESS;
}

/* Libraries are context-independent: their kernels (CUkernel) launch through cuLaunchKernel* in whatever
 * context the launch's stream has. */
struct CUlib_st {
    unsigned magic;
};
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
                                  CUlibraryOption *lo, void **lv, unsigned int nl) {
    COUNT();
    CHECK(0);
    (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
    if (!lib || !code) return CUDA_ERROR_INVALID_VALUE;
    struct CUlib_st *l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = MAGIC_MOD;
    *lib = l;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) {
    COUNT();
    CHECK(0);
    if (!k || !lib || lib->magic != MAGIC_MOD || !name) return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *fn = calloc(1, sizeof *fn);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    fn->magic = MAGIC_FUNC;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    *k = (CUkernel)fn;
    return CUDA_SUCCESS;
}

TWINS(cuLaunchKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
       CUstream s, void **params, void **extra),
      (void)bx, (void)by, (void)bz, (void)shm, (void)extra;
      return launch(f, GRID(gx, gy, gz), params, s);)

TWINS(cuLaunchCooperativeKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
       CUstream s, void **params),
      (void)bx, (void)by, (void)bz, (void)shm;
      return launch(f, GRID(gx, gy, gz), params, s);)

TWINS(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (void)extra;
      if (!c) return CUDA_ERROR_INVALID_VALUE;
      return launch(f, GRID(c->gridDimX, c->gridDimY, c->gridDimZ), params, c->hStream);)

/* The CUDA 2.0 launches (deprecated, still declared by cuda.h): a grid of width x height blocks, cuLaunch one block,
 * on the legacy default stream unless given one. */
EXPORT CUresult cuLaunch(CUfunction f) {
    COUNT();
    return launch(f, 1, NULL, NULL);
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
    COUNT();
    if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, GRID(w, h, 1), NULL, NULL);
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    COUNT();
    if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, GRID(w, h, 1), NULL, s);
}

/* One kernel per entry, each on its own stream (deprecated since CUDA 11.3, still declared). */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned flags) {
    COUNT();
    (void)flags;
    if (!l || n == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult r =
            launch(l[i].function, GRID(l[i].gridDimX, l[i].gridDimY, l[i].gridDimZ), l[i].kernelParams, l[i].hStream);
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- streams and capture */

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = calloc(1, sizeof *st);
    if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
    *st = (struct CUstream_st){.magic = MAGIC_STREAM, .device = cur_device(), .ctx = current()};
    *s = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    COUNT();
    CHECK(0);
    if (!s || s->magic != MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s) {
    CHECK(1);
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->capturing) { /* its work is not scheduled: the capture is invalid from now on */
        s->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    wait_idle(stream_device(s));
    release_pools_of(stream_device(s));
    return CUDA_SUCCESS;
}

/* Asking a capturing stream for its device: the real H100 (driver 580) answers cuStreamGetDevice on a capturing
 * stream with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, in every mode and from any thread
 * (tests/real-gpu/h100-driver-facts.txt); every later call on that stream in the capture returns
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (the driver's own error log, CUDA_LOG_FILE). cuStreamGetCtx,
 * cuStreamIsCapturing and cuCtxGetDevice are allowed. Whether the call fails; CUDA_SUCCESS when it may go on. */
static CUresult stream_query_in_capture(CUstream s) {
    if (!s || !s->capturing) return CUDA_SUCCESS;
    if (s->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    s->invalidated = 1;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* What a call that is allowed during capture gets on a capture already invalidated. */
static CUresult stream_in_invalid_capture(CUstream s) {
    return s && s->capturing && s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

static CUresult stream_get_device(CUstream s, CUdevice *d) {
    CHECK(0);
    if (!d || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    CUresult c = stream_query_in_capture(s);
    if (c != CUDA_SUCCESS) return c;
    if (!s && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    *d = stream_device(s);
    return CUDA_SUCCESS;
}

static CUresult stream_get_ctx(CUstream s, CUcontext *c) {
    CHECK(!s);
    if (!c || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    CUresult q = stream_in_invalid_capture(s);
    if (q != CUDA_SUCCESS) return q;
    *c = s ? s->ctx : current();
    return CUDA_SUCCESS;
}

TWINS(cuStreamGetCtx, (CUstream s, CUcontext *c), return stream_get_ctx(s, c);)

TWINS(cuStreamGetDevice, (CUstream s, CUdevice *d), return stream_get_device(s, d);)

/* ---- capture interaction modes (cuThreadExchangeStreamCaptureMode, cuStreamBeginCapture_v2) ----
 * A thread whose own mode is not relaxed is prohibited from potentially unsafe calls when it has an open
 * capture of its own not begun in relaxed mode, or (its mode global) when another thread has one begun in
 * global mode. A prohibited call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 * captures that prohibited it: their cuStreamEndCapture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no
 * graph. Which calls are unsafe follows the real driver's record (tests/real-gpu/h100-driver-facts.txt,
 * checked by `t_capture record`): cuMemAlloc, cuCtxSynchronize, cuStreamQuery, cuStreamSynchronize,
 * cuEventQuery, cuEventSynchronize, cuMemPoolGetAttribute and cuMemPoolTrimTo; not cuMemGetInfo,
 * cuEventRecord, cuDeviceGetGraphMemAttribute, cuDeviceGraphMemTrim, cuCtxPush/PopCurrent or
 * cuPointerGetAttribute (of an ordinary allocation; of a captured one it was not measured, and the fake
 * allows it). A wait for the capturing stream itself (cuStreamQuery, cuStreamSynchronize of it,
 * cuCtxSynchronize of its context) invalidates it in every mode and from every thread. cuEventQuery of an
 * event last recorded into a capture returns CUDA_ERROR_INVALID_VALUE and invalidates nothing. */
#define MAX_OPEN_CAPTURES 64
static __thread CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static CUstream open_captures[MAX_OPEN_CAPTURES]; /* under mu */
static _Atomic int open_capture_count;

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    COUNT();
    CHECK(0);
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* Whether this thread may not make a potentially unsafe call now; if so, the captures that forbid it are
 * invalidated. Caller holds mu. */
static int unsafe_call_invalidates_locked(void) {
    if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
    int hit = 0;
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++) {
        CUstream c = open_captures[i];
        if (!c || c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        int mine = pthread_equal(c->owner, pthread_self());
        if (mine ||
            (thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            hit = 1;
        }
    }
    return hit;
}

static int unsafe_call_invalidates(void) {
    if (!atomic_load(&open_capture_count)) return 0;
    pthread_mutex_lock(&mu);
    int hit = unsafe_call_invalidates_locked();
    pthread_mutex_unlock(&mu);
    return hit;
}

/* A wait for a device's streams (cuCtxSynchronize) while one of them captures: that capture is invalidated,
 * in every mode and from every thread. Whether there was one. */
static int waiting_on_capture_invalidates(int device) {
    if (!atomic_load(&open_capture_count)) return 0;
    int hit = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++)
        if (open_captures[i] && open_captures[i]->device == device) {
            open_captures[i]->invalidated = 1;
            hit = 1;
        }
    pthread_mutex_unlock(&mu);
    return hit;
}

/* Not in cuda_min.h: the library does not call it; applications (and the record's test) do. */
EXPORT CUresult cuStreamQuery(CUstream s);
EXPORT CUresult cuStreamQuery(CUstream s) {
    COUNT();
    CHECK(1);
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->capturing) { /* asks whether captured work ran: the capture is invalid, in every mode */
        s->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&mu);
    int busy = devices[stream_device(s)].busy_until > now_ns();
    pthread_mutex_unlock(&mu);
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

TWINS(cuStreamSynchronize, (CUstream s), return stream_sync(s);)

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    CHECK(!s);
    if (!st || !valid_stream(s)) return CUDA_ERROR_INVALID_VALUE;
    *st = s && s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

TWINS(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus *st), return is_capturing(s, st);)

static CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
    CHECK(1);
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    if (s->magic != MAGIC_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = MAGIC_GRAPH;
    pthread_mutex_lock(&mu);
    int slot = 0;
    while (slot < MAX_OPEN_CAPTURES && open_captures[slot]) slot++;
    if (slot == MAX_OPEN_CAPTURES) {
        pthread_mutex_unlock(&mu);
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->capture = g;
    s->capturing = 1;
    s->mode = mode;
    s->owner = pthread_self();
    s->invalidated = 0;
    open_captures[slot] = s;
    atomic_fetch_add(&open_capture_count, 1);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

TWINS(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), return begin_capture(s, mode);)

static CUresult end_capture(CUstream s, CUgraph *g) {
    CHECK(1);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (!s || s->magic != MAGIC_STREAM || !s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_OPEN_CAPTURES; i++)
        if (open_captures[i] == s) open_captures[i] = NULL;
    atomic_fetch_sub(&open_capture_count, 1);
    pthread_mutex_unlock(&mu);
    s->capturing = 0;
    if (s->invalidated) {
        free(s->capture);
        s->capture = NULL;
        *g = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

TWINS(cuStreamEndCapture, (CUstream s, CUgraph *g), return end_capture(s, g);)

/* ---------------------------------------------------------------- graphs */

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
    COUNT();
    CHECK(0);
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *gr = calloc(1, sizeof *gr);
    if (!gr) return CUDA_ERROR_OUT_OF_MEMORY;
    gr->magic = MAGIC_GRAPH;
    *g = gr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                        const CUDA_KERNEL_NODE_PARAMS *p) {
    COUNT();
    CHECK(0);
    (void)deps, (void)n;
    if (!node || !g || g->magic != MAGIC_GRAPH || !p) return CUDA_ERROR_INVALID_VALUE;
    g->duration_ns += kernel_ns(GRID(p->gridDimX, p->gridDimY, p->gridDimZ));
    g->nodes++;
    *node = (CUgraphNode)(uintptr_t)g->nodes;
    return CUDA_SUCCESS;
}

static CUresult add_alloc_node(CUgraphNode *node, CUgraph g, const CUmemPoolProps *props, size_t bytes,
                               CUdeviceptr *dptr) {
    if (!node || !g || g->magic != MAGIC_GRAPH || bytes == 0 || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = graph_alloc(g, props->location.id, bytes, dptr);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS) *node = (CUgraphNode)(uintptr_t)++g->nodes;
    return r;
}

static CUresult add_free_node(CUgraphNode *node, CUgraph g, CUdeviceptr dptr) {
    if (!node || !g || g->magic != MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = graph_free(g, dptr);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS) *node = (CUgraphNode)(uintptr_t)++g->nodes;
    return r;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    COUNT();
    CHECK(0);
    (void)deps, (void)n;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return add_alloc_node(node, g, &p->poolProps, p->bytesize, &p->dptr);
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                      CUdeviceptr dptr) {
    COUNT();
    CHECK(0);
    (void)deps, (void)n;
    return add_free_node(node, g, dptr);
}

static CUresult add_node(CUgraphNode *node, CUgraph g, CUgraphNodeParams *p) {
    CHECK(0);
    if (!p || !node || !g || g->magic != MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
            g->duration_ns += kernel_ns(GRID(p->kernel.gridDimX, p->kernel.gridDimY, p->kernel.gridDimZ));
            *node = (CUgraphNode)(uintptr_t)++g->nodes;
            return CUDA_SUCCESS;
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
            return add_alloc_node(node, g, &p->alloc.poolProps, p->alloc.bytesize, &p->alloc.dptr);
        case CU_GRAPH_NODE_TYPE_MEM_FREE:
            return add_free_node(node, g, p->free.dptr);
        default:
            return CUDA_ERROR_NOT_SUPPORTED;
    }
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p) {
    COUNT();
    (void)deps, (void)n;
    return add_node(node, g, p);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                                  size_t n, CUgraphNodeParams *p) {
    COUNT();
    (void)deps, (void)data, (void)n;
    return add_node(node, g, p);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    if (!e || !g || g->magic != MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    *x = (struct CUgraphExec_st){
        MAGIC_EXEC, cur_device(), g->duration_ns, g->alloc_dev, g->alloc_bytes, g->alloc_bytes - g->freed_bytes, 0};
    *e = x;
    return CUDA_SUCCESS;
}

/* The CUDA 10 and 11 ABI: no flags, an error node and a log (empty: nothing failed). */
static CUresult instantiate_logged(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t size) {
    CUresult r = cuGraphInstantiateWithFlags(e, g, 0);
    if (err) *err = NULL;
    if (log && size) log[0] = '\0';
    return r;
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t size) {
    return instantiate_logged(e, g, err, log, size);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t size) {
    return instantiate_logged(e, g, err, log, size);
}

/* The first upload or launch of a graph with allocation nodes takes their memory from the device's graph
 * memory pool, which grows from the device when it holds too little; what the graph does not free stays
 * allocated (in use) until freed or the graph is destroyed. Caller holds mu. */
static CUresult exec_materialise(CUgraphExec e) {
    if (e->live || !e->alloc_bytes) return CUDA_SUCCESS;
    struct device *d = &devices[e->alloc_dev];
    uint64_t need = d->gm_used + e->alloc_bytes;
    if (need > d->gm_reserved) {
        uint64_t grow = need - d->gm_reserved;
        if (grow > G.memory - d->used) return CUDA_ERROR_OUT_OF_MEMORY;
        d->used += grow;
        d->gm_reserved += grow;
    }
    d->gm_used += e->persist_bytes;
    e->live = 1;
    return CUDA_SUCCESS;
}

static CUresult graph_upload(CUgraphExec e, CUstream s) {
    CHECK(1);
    if (!e || e->magic != MAGIC_EXEC || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    CUresult r = exec_materialise(e);
    pthread_mutex_unlock(&mu);
    return r;
}

TWINS(cuGraphUpload, (CUgraphExec e, CUstream s), return graph_upload(e, s);)

static CUresult graph_launch(CUgraphExec e, CUstream s) {
    CHECK(1);
    if (!e || e->magic != MAGIC_EXEC || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (s && s->capturing) {
        s->capture->duration_ns += e->duration_ns;
        s->capture->nodes++;
        return CUDA_SUCCESS;
    }
    if (e->alloc_bytes) {
        pthread_mutex_lock(&mu);
        CUresult r = exec_materialise(e);
        pthread_mutex_unlock(&mu);
        if (r != CUDA_SUCCESS) return r;
    }
    enqueue(e->device, e->duration_ns);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    COUNT();
    CHECK(0);
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    struct device *d = &devices[dev];
    uint64_t keep = granules(d->gm_used);
    if (d->gm_reserved > keep) {
        d->used -= d->gm_reserved - keep;
        d->gm_reserved = keep;
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value) {
    COUNT();
    CHECK(0);
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
        case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)value = devices[dev].gm_reserved;
            break;
        case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = devices[dev].gm_used;
            break;
        default:
            r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

TWINS(cuGraphLaunch, (CUgraphExec e, CUstream s), return graph_launch(e, s);)

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    COUNT();
    if (!e || e->magic != MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (e->live) {
        struct device *d = &devices[e->alloc_dev];
        d->gm_used -= e->persist_bytes < d->gm_used ? e->persist_bytes : d->gm_used;
    }
    pthread_mutex_unlock(&mu);
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    COUNT();
    if (!g || g->magic != MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    g->magic = 0;
    free(g);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- events */

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    COUNT();
    CHECK(1);
    (void)flags;
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (G.event_create_fails) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *ctx = current();
    *ev = (struct CUevent_st){MAGIC_EVENT, cur_device(), 0, 0, ctx, ctx ? ctx->gen : 0, 0};
    *e = ev;
    return CUDA_SUCCESS;
}

/* Uses of an event whose context was destroyed since it was made (the driver's answer:
 * CUDA_ERROR_CONTEXT_IS_DESTROYED; on a real driver, undefined). Tests read the count. */
static _Atomic unsigned long stale_event_uses;
EXPORT unsigned long fakecuda_stale_event_uses(void) { return stale_event_uses; }
static int stale(CUevent e) {
    if (!e->ctx || e->gen == e->ctx->gen) return 0;
    stale_event_uses++;
    return 1;
}

/* Recording an event needs a current context, even on a stream that names its own (as the real driver). */
static CUresult event_record(CUevent e, CUstream s) {
    CHECK(1);
    if (!e || e->magic != MAGIC_EVENT || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (e->device != stream_device(s)) return CUDA_ERROR_INVALID_HANDLE; /* another context's event */
    if (stale(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (s && s->capturing) { /* an event node of the graph being built; the event has no time until re-recorded */
        e->captured = 1;
        e->recorded = 0;
        return CUDA_SUCCESS;
    }
    e->captured = 0;
    host_cost(HOST_EVENT_RECORD_NS);
    pthread_mutex_lock(&mu);
    uint64_t now = now_ns(), busy = devices[stream_device(s)].busy_until;
    e->ts = busy > now ? busy : after_neighbour(now); /* reached after our work, or the neighbour's */
    if (e->ts > now) devices[stream_device(s)].busy_until = e->ts + (G.real_timing ? EVENT_QUEUED_NS : 0);
    if (G.real_timing) e->ts = (e->ts + EVENT_TICK_NS - 1) / EVENT_TICK_NS * EVENT_TICK_NS;
    e->recorded = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

TWINS(cuEventRecord, (CUevent e, CUstream s), return event_record(e, s);)

EXPORT CUresult cuEventQuery(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (stale(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (e->captured) return CUDA_ERROR_INVALID_VALUE; /* the record: checked first, invalidates nothing */
    host_cost(HOST_EVENT_QUERY_NS);
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return !e->recorded || e->ts <= now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (unsafe_call_invalidates()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (e->recorded) sleep_until(e->ts);
    release_pools_of(e->device);
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b) {
    CHECK(0);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != MAGIC_EVENT || b->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (stale(a) || stale(b)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = now_ns();
    if (a->ts > now || b->ts > now) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->ts - (double)a->ts) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    COUNT();
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    COUNT();
    return elapsed(ms, a, b);
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    COUNT();
    CHECK(0);
    if (!e || e->magic != MAGIC_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}
