/*
 * A fake CUDA driver (libcuda.so.1) for testing the limiter on machines without a GPU: what its files share.
 *
 * It stands in for NVIDIA's driver and keeps its semantics where the limiter depends on them:
 *   - it exports every driver entry point src/cuda_min.h declares (weak stubs returning CUDA_ERROR_NOT_SUPPORTED,
 *     generated from src/cuda_min.h by gen_proctable.py), with real implementations for what the tests use;
 *   - cuGetProcAddress(_v2) resolves (base name, cudaVersion, flags) to the exact ABI variant from that
 *     generated table of its own function pointers (never through dlsym), with the documented statuses;
 *   - calls before cuInit fail with CUDA_ERROR_NOT_INITIALIZED, calls without a current context with
 *     CUDA_ERROR_INVALID_CONTEXT, allocations beyond the device's memory with CUDA_ERROR_OUT_OF_MEMORY;
 *   - device memory is accounted (cuMemGetInfo is truthful);
 *   - kernels take simulated time: launches return at once and queue on the device (all streams of a
 *     device run one after another), a launch blocks when 1024 are queued, events complete when the work
 *     queued before them has, and synchronisation sleeps until the device is idle. A kernel of B blocks
 *     runs ceil(B / SMs) waves of FAKE_CUDA_WAVE_NS each; a graph runs its kernel nodes back to back.
 *
 * One file per driver API family, as the limiter's src/:
 *   driver.c    settings, the simulated devices and their lock, fork handling; cuInit, versions, error
 *               strings, cuGetProcAddress
 *   hooks.c     what tests read besides the driver API: call counters and the other fakecuda_* exports
 *   devices.c   device enumeration, UUIDs and attributes
 *   contexts.c  primary and created contexts, the current-context stack, limits and the memory they hold
 *   memory.c    the allocation table; cuMemAlloc and its relatives in every ABI, pointer attributes, arrays
 *   pools.c     stream-ordered allocation and memory pools
 *   vmm.c       virtual memory management: physical handles, mappings, shareable handles
 *   ipc.c       legacy CUDA IPC handles
 *   launch.c    simulated execution: modules, launches, streams and events
 *   capture.c   stream capture and the real driver's rules for calls made during one
 *   graphs.c    graphs, their memory nodes and the device's graph memory pool
 *
 * Settings: see fake_common.h; FAKE_CUDA_GETPROC_LOG=<file> logs every cuGetProcAddress lookup. Extra exports
 * for tests (not driver API): fakecuda_calls(name), fakecuda_busy_ns(dev), fakecuda_used_bytes(dev),
 * fakecuda_stale_event_uses(), fakecuda_symbol(name).
 *
 * Every file defines _GNU_SOURCE and includes this header first. The files are compiled with
 * -fvisibility=hidden: the library exports what EXPORT marks (entry points and the fakecuda_* hooks) and the
 * generated table's stubs, nothing this header declares. Linked with -Bsymbolic so that the addresses it
 * hands out are its own even when a preloaded library exports the same names.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include "cuda_min.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "fake_common.h"

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

/* ---------------------------------------------------------------- call counters (hooks.c) */

/* The counter of the entry point with this name (created on first use). */
_Atomic unsigned long *fake_counter(const char *name);
void fake_counters_lock(void);
void fake_counters_unlock(void);

/* Counts a call of the entry point it opens (fakecuda_calls reads the count). */
#define COUNT()                                                                                                        \
    do {                                                                                                               \
        static _Atomic unsigned long *_Atomic counter_;                                                                \
        _Atomic unsigned long *c_ = atomic_load_explicit(&counter_, memory_order_relaxed);                             \
        if (!c_) atomic_store(&counter_, c_ = fake_counter(__func__));                                                 \
        atomic_fetch_add_explicit(c_, 1, memory_order_relaxed);                                                        \
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

/* ---------------------------------------------------------------- objects */

/* Every handle the fake hands out starts with one of these (one list, so that no two kinds share a value). */
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
/* Graph memory: what the graph's allocation nodes reserve (alloc_bytes) and what its free nodes give back
 * to the device's graph memory pool at the end of each launch (freed_bytes); one device per graph. */
struct CUgraph_st {
    unsigned magic;
    uint64_t duration_ns;
    unsigned nodes;
    int alloc_dev;
    uint64_t alloc_bytes, freed_bytes;
};
/* A stream-ordered memory pool: reserved is what it holds from the device, in_use what is allocated from it;
 * above the release threshold, unused memory goes back to the device at synchronisation points. */
struct CUmemPoolHandle_st {
    unsigned magic;
    int device;
    uint64_t reserved, in_use, threshold;
};

#define QUEUE_DEPTH 1024
#define THREADS_PER_SM 2048 /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR */

/* ---------------------------------------------------------------- devices and settings (driver.c) */

struct device {
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
};
extern struct device devices[FAKE_MAX_DEVICES];

/* The settings (FAKE_CUDA_*, fake_common.h), read on the first call. */
struct fake_settings {
    atomic_int initialized; /* the real driver may be asked from any thread while another initialises */
    int count;
    uint64_t memory, sms, wave_ns;
    int driver_version;
    int event_create_fails;
    int real_timing; /* FAKE_CUDA_REAL_TIMING: the H100's launch latency, event ticks and host costs */
    uint64_t neighbour_busy_ns, neighbour_period_ns; /* FAKE_CUDA_NEIGHBOUR_BUSY_US / _FREE_US */
    uint64_t ctx_stack, ctx_heap, ctx_fifo;          /* a new context's limits */
    uint64_t ctx_base;                               /* what a context holds besides its limits' memory */
};
extern struct fake_settings G;

/* The lock over the devices, the allocation table, pools and open captures. */
extern pthread_mutex_t mu;

/* Reads the settings and sets the devices up, once. */
void fake_configure(void);

/* publish.c: publishes this process's per-device figures for the fake NVML ($FAKE_CUDA_PROCESS_DIR). */
void fake_publish_start(void);

/* Common checks: initialised, and (if need_ctx) a current context. */
CUresult check(int need_ctx);

#define CHECK(need_ctx)                                                                                                \
    do {                                                                                                               \
        CUresult e_ = check(need_ctx);                                                                                 \
        if (e_ != CUDA_SUCCESS) return e_;                                                                             \
    } while (0)

static inline int valid_device(int d) { return d >= 0 && d < G.count; }

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline unsigned int clamp32(uint64_t v) { return v > 0xffffffffull ? 0xffffffffu : (unsigned int)v; }

/* ---------------------------------------------------------------- contexts.c */

/* The calling thread's current context, or NULL. */
CUcontext current(void);
static inline int cur_device(void) { return current()->device; }

/* ---------------------------------------------------------------- the allocation table (memory.c) */

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
static inline uint64_t granules(uint64_t b) {
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

/* The entry of a kind at an address or handle, or NULL. Caller holds mu (as for all of these). */
struct alloc *alloc_find(uint64_t key, int kind);
/* Adds an entry (the table may move: pointers into it are stale after); -1 when out of memory. */
int alloc_put(struct alloc a);
/* The next entry of a kind at or after *cursor, in table order, or NULL; *cursor moves past it. */
struct alloc *alloc_next(size_t *cursor, int kind);
/* A fresh device address for bytes on a device; low: below 4 GiB, for the CUDA 2.0 (32-bit) ABI. */
uint64_t new_addr(int device, uint64_t bytes, int low);
/* Frees what an address holds: device memory, a pool's allocation or a graph allocation. */
CUresult device_free(uint64_t addr, int kind);

/* vmm.c: allocations kept only by a descriptor go once it is closed (the fake notices when asked). */
void settle_descriptors(void);

/* ---------------------------------------------------------------- pools.c, graphs.c */

/* At a synchronisation point each pool of the device releases what it holds beyond its release threshold. */
void release_pools_of(int device);
/* A graph allocation: an address now, memory when the graph is launched. Caller holds mu. */
CUresult graph_alloc(CUgraph g, int device, uint64_t bytes, CUdeviceptr *out);
/* A free node of graph g for an address its allocation nodes made. Caller holds mu. */
CUresult graph_free(CUgraph g, uint64_t addr);

/* ---------------------------------------------------------------- launch.c: simulated execution */

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

/* A kernel of this many blocks: its waves' time. */
uint64_t kernel_ns(uint64_t blocks);
/* Queues work of the given duration on a device; blocks while QUEUE_DEPTH launches are pending. */
void enqueue(int device, uint64_t duration);
/* Sleeps until the device's queued work is done. */
void wait_idle(int device);
/* Uses of an event whose context was destroyed since it was made (fakecuda_stale_event_uses). */
extern _Atomic unsigned long stale_event_uses;

static inline int valid_stream(CUstream s) { return !s || s->magic == MAGIC_STREAM; }
static inline int stream_device(CUstream s) { return s ? s->device : cur_device(); }

/* ---------------------------------------------------------------- capture.c */

/* Whether this thread may not make a potentially unsafe call now; if so, the captures that forbid it are
 * invalidated (see capture.c). */
int unsafe_call_invalidates(void);
/* A wait for a device's streams while one of them captures invalidates that capture. Whether there was one. */
int waiting_on_capture_invalidates(int device);

#endif
