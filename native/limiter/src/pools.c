/*
 * Memory the driver keeps for the process beyond its live allocations: stream-ordered memory pools and
 * the graph memory pool of each device.
 *
 * A pool keeps what cuMemFreeAsync gives back (up to its release threshold, until a synchronisation
 * point or cuMemPoolTrimTo), and the graph memory pool keeps what graph allocations used (until
 * cuDeviceGraphMemTrim). Neither is a live allocation, yet both hold device memory that other tenants of
 * the GPU cannot have. So each pool the process allocates from, and each device's graph memory pool, is
 * charged exactly what the driver reports it reserves (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
 * CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), re-read after every call that can change it and before any
 * allocation of the device is refused.
 *
 * A stream-ordered allocation is admitted by charging its size to the device of its pool or stream before
 * the driver is called (over the limit: CUDA_ERROR_OUT_OF_MEMORY, the driver is not called); afterwards the
 * device the pointer really landed on is asked, and the pre-charge is replaced by the pool's growth. Should
 * the pool have grown beyond the limit (the driver reserves in chunks), the allocation is freed again and
 * refused. During stream capture the allocation is a graph allocation node: admitted the same way, then
 * recorded for the graph the capture produces, which is charged when it is first uploaded or launched (a
 * free during capture refunds nothing). Graph allocation nodes (cuGraphAddMemAllocNode, cuGraphAddNode) are
 * admitted when added and charged the same way.
 *
 * The pool table's mutex is never held across a driver call: the driver is read first, then the charge is
 * moved to the value read.
 *
 * Why one file of more than 600 lines: the pool table and the graph memory pools are one state under one mutex
 * (mu), settled by the same code (settle, sync_pool, sync_graphmem) from the allocation path, the charges' reclaim
 * and the driver entry points below that change what a pool holds; split over files, that lock and the tables it
 * guards would become an interface of their own.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "pools.h"
#include "fork.h"
#include "capture.h"
#include "common.h"
#include "devices.h"
#include "driver.h"
#include "ledger.h"
#include "log.h"
#include "region.h"

#define MAX_POOLS 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct pool_rec {
    CUmemoryPool pool; /* NULL: free entry */
    int ordinal, dev;
    uint64_t charged;
} pools[MAX_POOLS];
static struct {
    int dev; /* region device + 1; 0: this ordinal's graph memory was never charged */
    uint64_t charged;
} graphmem[DL_MAX_DEVICES];
_Atomic int dl_graphmem_pending;  /* executable graphs whose allocations are not charged yet */
static _Atomic int graphmem_used; /* 1 once any graph allocation was seen */
static _Atomic bool active;       /* set once the process has a pool or a graph memory pool in the tables */

/* Charges of the device settle pools first (the ledger calls back, once it has been told to here). */
static const struct dl_reclaimer reclaimer = {dl_pools_active, dl_pools_reclaim};
static void mark_active(void) {
    dl_charge_reclaimer(&reclaimer);
    atomic_store(&active, true);
}

static void dl_pools_reset_after_fork(void) {
    pthread_mutex_init(&mu, NULL);
    memset(pools, 0, sizeof pools);
    memset(graphmem, 0, sizeof graphmem);
    atomic_store(&dl_graphmem_pending, 0);
    atomic_store(&graphmem_used, 0);
    atomic_store(&active, false);
}
DL_FORK_HANDLERS(DL_FORK_POOLS, NULL, NULL, dl_pools_reset_after_fork);

/* Moves a charge to `reserved`, what the driver says it holds now. pre (may be NULL) is a charge made for
 * the call that changed it, absorbed here. Enforcing a limit, a growth beyond it is refused (-1) and
 * nothing changes but the pre-charge's refund. Caller holds mu. */
static int settle(uint64_t *charged, int dev, uint64_t reserved, struct dl_charge *pre, uint64_t limit) {
    uint64_t have = 0;
    if (pre && pre->bytes) {
        if (pre->dev == dev) have = pre->bytes;
        else dl_region_release(pre->dev, pre->bytes);
        pre->bytes = 0;
    }
    if (reserved > *charged) {
        uint64_t need = reserved - *charged;
        if (need > have) {
            if (dl_region_reserve(dev, need - have, limit) != 0) {
                if (have) dl_region_release(dev, have);
                return -1;
            }
        } else if (have > need) {
            dl_region_release(dev, have - need);
        }
    } else if (*charged - reserved + have) {
        dl_region_release(dev, *charged - reserved + have);
    }
    *charged = reserved;
    return 0;
}

/* Pool reads happen at sync points and before admissions, perhaps while the application captures: relaxed
 * then (dl_capture_relax), so that they can never invalidate its capture. */
static int pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, uint64_t *out) {
    cuuint64_t v = 0;
    if (!dl_cuda.cuMemPoolGetAttribute) return -1;
    int saved = dl_capture_relax();
    CUresult r = dl_cuda.cuMemPoolGetAttribute(pool, attr, &v);
    dl_capture_restore(saved);
    if (r != CUDA_SUCCESS) return -1;
    *out = v;
    return 0;
}

static int graphmem_attr(int ordinal, CUgraphMem_attribute attr, uint64_t *out) {
    cuuint64_t v = 0;
    if (!dl_cuda.cuDeviceGetGraphMemAttribute) return -1;
    int saved = dl_capture_relax();
    CUresult r = dl_cuda.cuDeviceGetGraphMemAttribute(ordinal, attr, &v);
    dl_capture_restore(saved);
    if (r != CUDA_SUCCESS) return -1;
    *out = v;
    return 0;
}

static int read_pool(CUmemoryPool pool, uint64_t *reserved) {
    return pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved);
}

static int read_graphmem(int ordinal, uint64_t *reserved) {
    return graphmem_attr(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved);
}

/* The pool's entry, added on first sight; NULL when the table is full (then it is not charged beyond its
 * live allocations' pre-charges: logged once). Caller holds mu. */
static struct pool_rec *pool_entry(CUmemoryPool pool, int ordinal, int dev) {
    struct pool_rec *free_rec = NULL;
    for (int i = 0; i < MAX_POOLS; i++) {
        if (pools[i].pool == pool) return &pools[i];
        if (!pools[i].pool && !free_rec) free_rec = &pools[i];
    }
    if (!free_rec) {
        static int warned;
        if (!warned++) dl_warn("more than %d memory pools: further pools are charged per allocation", MAX_POOLS);
        return NULL;
    }
    *free_rec = (struct pool_rec){pool, ordinal, dev, 0};
    mark_active();
    return free_rec;
}

/* Re-reads a pool and moves its charge: 0, or -1 when a growth would exceed the limit (enforce), or
 * UNTRACKED when the pool cannot be read or kept in the table (pre is left as it is then). */
#define UNTRACKED (-2)
static int sync_pool(CUmemoryPool pool, int ordinal, struct dl_charge *pre, int enforce) {
    uint64_t limit, reserved;
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0) {
        if (pre) dl_refund(pre);
        return 0;
    }
    if (read_pool(pool, &reserved) != 0) return UNTRACKED;
    pthread_mutex_lock(&mu);
    struct pool_rec *p = pool_entry(pool, ordinal, dev);
    int r = p ? settle(&p->charged, p->dev, reserved, pre, enforce ? limit : DL_NO_LIMIT) : UNTRACKED;
    pthread_mutex_unlock(&mu);
    return r;
}

static int sync_graphmem(int ordinal, struct dl_charge *pre, int enforce) {
    uint64_t limit, reserved;
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0 || read_graphmem(ordinal, &reserved) != 0) {
        if (pre) dl_refund(pre);
        return 0;
    }
    pthread_mutex_lock(&mu);
    graphmem[ordinal].dev = dev + 1;
    mark_active();
    int r = settle(&graphmem[ordinal].charged, dev, reserved, pre, enforce ? limit : DL_NO_LIMIT);
    pthread_mutex_unlock(&mu);
    return r;
}

/* Whether this device's graph memory pool has been charged (read under mu: it is set under mu). */
static int graph_known(int ordinal) {
    pthread_mutex_lock(&mu);
    int known = graphmem[ordinal].dev != 0;
    pthread_mutex_unlock(&mu);
    return known;
}

bool dl_pools_active(void) { return atomic_load_explicit(&active, memory_order_relaxed); }

void dl_pools_reclaim(int ordinal) {
    if (ordinal < 0 || ordinal >= DL_MAX_DEVICES) return;
    int dev = dl_device_for_ordinal(ordinal, NULL);
    if (dev < 0) return;
    CUmemoryPool mine[MAX_POOLS];
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool && pools[i].ordinal == ordinal) mine[n++] = pools[i].pool;
    int graph = graphmem[ordinal].dev != 0;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) sync_pool(mine[i], ordinal, NULL, 0);
    if (graph) sync_graphmem(ordinal, NULL, 0);
}

static int pointer_ordinal(CUdeviceptr p) {
    int o = -1;
    if (!dl_cuda.cuPointerGetAttribute ||
        dl_cuda.cuPointerGetAttribute(&o, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != CUDA_SUCCESS)
        return -1;
    return o;
}

static int pool_ordinal(CUmemoryPool pool) {
    int o = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool == pool) o = pools[i].ordinal;
    pthread_mutex_unlock(&mu);
    return o;
}

static int capturing(CUstream s, int ptsz) { return dl_stream_capture_status(s, ptsz) == 1; }

/* Graph records are keyed by object and device: pointers leave the top byte free. */
static uint64_t gkey(const void *obj, int ordinal) {
    return (uint64_t)(uintptr_t)obj | ((uint64_t)(ordinal + 1) << 56);
}

static void graph_add(unsigned kind, const void *obj, int ordinal, uint64_t bytes) {
    int dev;
    uint64_t have = 0, aux;
    pthread_mutex_lock(&mu); /* take + put as one step */
    if (!dl_rec_take(kind, gkey(obj, ordinal), &dev, &have, &aux)) have = 0;
    dl_rec_put(kind, gkey(obj, ordinal), ordinal, have + bytes, 0);
    pthread_mutex_unlock(&mu);
    atomic_store(&graphmem_used, 1);
}

/* Moves every device's record of one object to another (capture -> graph, graph -> executable graph);
 * keep: the source stays (a graph can be instantiated many times). Returns how many moved. */
static int graph_move(unsigned from_kind, const void *from, unsigned to_kind, const void *to, int keep) {
    int moved = 0;
    if (!atomic_load(&graphmem_used)) return 0;
    for (int o = 0; o < DL_MAX_DEVICES; o++) {
        int dev;
        uint64_t bytes, aux;
        pthread_mutex_lock(&mu);
        int found = dl_rec_take(from_kind, gkey(from, o), &dev, &bytes, &aux);
        if (found && keep) dl_rec_put(from_kind, gkey(from, o), dev, bytes, aux);
        if (found && to) dl_rec_put(to_kind, gkey(to, o), o, bytes, 0);
        pthread_mutex_unlock(&mu);
        moved += found;
    }
    return moved;
}

/* A stream-ordered allocation during capture is a graph allocation node: admitted now, charged when the
 * graph is first uploaded or launched. The capture must survive the library: its own calls run relaxed (a
 * global- or thread-local-mode capture forbids potentially unsafe calls), and the address is not asked
 * about - it names a node of the graph being built, not memory; it lands on its pool's or stream's device. */
static CUresult captured_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int variant, int ordinal,
                               CUresult (*call)(CUdeviceptr *, size_t, CUmemoryPool, CUstream, int)) {
    int saved = dl_capture_relax();
    struct dl_charge c;
    CUresult r = dl_charge(ordinal, bytes, &c);
    dl_refund(&c);
    dl_capture_restore(saved);
    if (r != CUDA_SUCCESS) return r;
    r = call(dptr, bytes, pool, s, variant);
    if (r != CUDA_SUCCESS) return r;
    saved = dl_capture_relax();
    graph_add(DL_REC_CAPTURE, s, ordinal, dl_round_granule(ordinal, bytes));
    dl_capture_restore(saved);
    return r;
}

CUresult dl_ordered_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int variant,
                          CUresult (*call)(CUdeviceptr *, size_t, CUmemoryPool, CUstream, int)) {
    int ptsz = variant & 1;
    /* Whether the stream captures is asked first: a capturing stream must not be asked for its device (the
     * real driver invalidates the capture); then the allocation's device is its pool's, else the current
     * context's (the capturing thread's, as the application's own cuMemAllocAsync sees it). */
    int in_capture = capturing(s, ptsz);
    int ordinal = pool ? pool_ordinal(pool) : -1;
    if (ordinal < 0) ordinal = in_capture ? dl_current_ordinal() : dl_stream_ordinal(s, ptsz);
    if (in_capture) return captured_alloc(dptr, bytes, pool, s, variant, ordinal, call);
    /* What the pool keeps unused serves the allocation first: only the rest can make it grow. */
    CUmemoryPool target = pool;
    if (!target && ordinal >= 0 && dl_cuda.cuDeviceGetMemPool &&
        dl_cuda.cuDeviceGetMemPool(&target, ordinal) != CUDA_SUCCESS)
        target = NULL;
    uint64_t spare = 0, reserved, used = 0;
    if (target && read_pool(target, &reserved) == 0 &&
        pool_attr(target, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == 0 && reserved > used)
        spare = reserved - used;
    struct dl_charge c;
    CUresult r = dl_charge(ordinal, bytes > spare ? bytes - spare : 0, &c);
    if (r != CUDA_SUCCESS) return r;
    r = call(dptr, bytes, pool, s, variant);
    if (r != CUDA_SUCCESS) {
        dl_refund(&c);
        return r;
    }
    int actual = pointer_ordinal(*dptr);
    if (actual < 0) actual = ordinal;
    if (!pool && actual == ordinal) pool = target;
    if (!pool && (!dl_cuda.cuDeviceGetMemPool || dl_cuda.cuDeviceGetMemPool(&pool, actual) != CUDA_SUCCESS)) {
        /* The pool cannot be told: the allocation keeps its own charge. */
        dl_rec_put(DL_REC_POOLPTR, *dptr, c.dev, c.bytes, 0);
        return r;
    }
    int dev = c.dev;
    int synced = sync_pool(pool, actual, &c, 1);
    if (synced == UNTRACKED) {
        /* The pool cannot be followed: the allocation keeps its own charge (logged once). */
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            dl_warn("a memory pool cannot be followed: its allocations are charged one by one");
        uint64_t full = dl_round_granule(actual, bytes), limit;
        if (c.dev >= 0 && c.bytes < full && dl_device_for_ordinal(actual, &limit) == c.dev) {
            if (dl_region_reserve(c.dev, full - c.bytes, limit) == 0) {
                c.bytes = full;
            } else {
                CUresult (*release)(CUdeviceptr, CUstream) =
                    ptsz ? dl_cuda.cuMemFreeAsync_ptsz : dl_cuda.cuMemFreeAsync;
                if (release) release(*dptr, s);
                dl_refund(&c);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        dl_rec_put(DL_REC_POOLPTR, *dptr, c.dev, c.bytes, 0);
        return r;
    }
    if (synced != 0) {
        /* The pool grew beyond the limit: give the allocation back and refuse it. */
        CUresult (*free_fn)(CUdeviceptr, CUstream) = ptsz ? dl_cuda.cuMemFreeAsync_ptsz : dl_cuda.cuMemFreeAsync;
        if (free_fn) free_fn(*dptr, s);
        sync_pool(pool, actual, NULL, 0);
        dl_info("refusing %zu bytes from a memory pool on device %d: the pool would exceed the claim's limit", bytes,
                actual);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dl_rec_put(DL_REC_POOLPTR, *dptr, dev, 0, (uint64_t)(uintptr_t)pool);
    return r;
}

void dl_pools_before_free(CUdeviceptr p, struct dl_pool_free *f) {
    f->ptr = p;
    f->known = p && dl_rec_take(DL_REC_POOLPTR, p, &f->dev, &f->bytes, &f->pool);
}

void dl_pools_after_free(const struct dl_pool_free *f, CUresult r) {
    if (r != CUDA_SUCCESS) {
        if (f->known) dl_rec_put(DL_REC_POOLPTR, f->ptr, f->dev, f->bytes, f->pool);
        return;
    }
    if (f->known && f->pool) {
        CUmemoryPool pool = (CUmemoryPool)(uintptr_t)f->pool;
        int o = pool_ordinal(pool);
        if (o >= 0) sync_pool(pool, o, NULL, 0);
    } else if (f->known && f->bytes) {
        dl_region_release(f->dev, f->bytes);
    } else if (f->ptr && atomic_load(&graphmem_used)) {
        /* Perhaps a graph allocation freed outside its graph: its memory returns to the graph memory pool. */
        for (int o = 0; o < DL_MAX_DEVICES; o++)
            if (graph_known(o)) sync_graphmem(o, NULL, 0);
    }
}

/* ---- graph allocation nodes ---- */

/* Admits a graph allocation of bytes on a device: refused when the claim could not hold it now. */
static CUresult admit_graph_alloc(int ordinal, size_t bytes) {
    struct dl_charge c;
    CUresult r = dl_charge(ordinal, bytes, &c);
    dl_refund(&c);
    return r;
}

static int alloc_node_device(const CUmemPoolProps *p) {
    return p->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p->location.id : -1;
}

#define REAL_OR_NOT_FOUND(name)                                                                                        \
    dl_cuda_init();                                                                                                    \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND

DL_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                          size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    REAL_OR_NOT_FOUND(cuGraphAddMemAllocNode);
    int o = nodeParams ? alloc_node_device(&nodeParams->poolProps) : -1;
    if (o >= 0) {
        CUresult a = admit_graph_alloc(o, nodeParams->bytesize);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r = dl_cuda.cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (r == CUDA_SUCCESS && o >= 0) graph_add(DL_REC_GRAPH, hGraph, o, dl_round_granule(o, nodeParams->bytesize));
    return r;
}

static int node_alloc_device(const CUgraphNodeParams *p) {
    return p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ? alloc_node_device(&p->alloc.poolProps) : -1;
}

DL_EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraphNodeParams *nodeParams) {
    REAL_OR_NOT_FOUND(cuGraphAddNode);
    int o = node_alloc_device(nodeParams);
    if (o >= 0) {
        CUresult a = admit_graph_alloc(o, nodeParams->alloc.bytesize);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r = dl_cuda.cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (r == CUDA_SUCCESS && o >= 0)
        graph_add(DL_REC_GRAPH, hGraph, o, dl_round_granule(o, nodeParams->alloc.bytesize));
    return r;
}

DL_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                     CUgraphNodeParams *nodeParams) {
    REAL_OR_NOT_FOUND(cuGraphAddNode_v2);
    int o = node_alloc_device(nodeParams);
    if (o >= 0) {
        CUresult a = admit_graph_alloc(o, nodeParams->alloc.bytesize);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r =
        dl_cuda.cuGraphAddNode_v2(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
    if (r == CUDA_SUCCESS && o >= 0)
        graph_add(DL_REC_GRAPH, hGraph, o, dl_round_granule(o, nodeParams->alloc.bytesize));
    return r;
}

void dl_graphmem_capture_ended(CUstream s, CUgraph g) { graph_move(DL_REC_CAPTURE, s, DL_REC_GRAPH, g, 0); }

static void instantiated(CUresult r, CUgraphExec *e, CUgraph g) {
    if (r != CUDA_SUCCESS || !e) return;
    int n = graph_move(DL_REC_GRAPH, g, DL_REC_EXEC, *e, 1);
    if (n) atomic_fetch_add(&dl_graphmem_pending, n);
}

DL_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuGraphInstantiateWithFlags);
    CUresult r = dl_cuda.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
    instantiated(r, phGraphExec, hGraph);
    return r;
}

/* The CUDA 10 and 11 ABI (cuda.h now maps cuGraphInstantiate to cuGraphInstantiateWithFlags): a program built
 * against an older toolkit, or a lookup asking for a version before 11.4, instantiates through these. */
DL_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                      char *logBuffer, size_t bufferSize) {
    REAL_OR_NOT_FOUND(cuGraphInstantiate);
    CUresult r = dl_cuda.cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
    instantiated(r, phGraphExec, hGraph);
    return r;
}

DL_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                         char *logBuffer, size_t bufferSize) {
    REAL_OR_NOT_FOUND(cuGraphInstantiate_v2);
    CUresult r = dl_cuda.cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
    instantiated(r, phGraphExec, hGraph);
    return r;
}

DL_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    REAL_OR_NOT_FOUND(cuGraphInstantiateWithParams);
    CUresult r = dl_cuda.cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
    instantiated(r, phGraphExec, hGraph);
    return r;
}

DL_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                     CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    REAL_OR_NOT_FOUND(cuGraphInstantiateWithParams_ptsz);
    CUresult r = dl_cuda.cuGraphInstantiateWithParams_ptsz(phGraphExec, hGraph, instantiateParams);
    instantiated(r, phGraphExec, hGraph);
    return r;
}

/* The first upload or launch of an executable graph with allocations: its allocations are charged before
 * the driver call (over the limit: CUDA_ERROR_OUT_OF_MEMORY), then the charge becomes the graph memory
 * pool's growth. */
CUresult dl_graphmem_before_launch(CUgraphExec g, struct dl_graph_ticket *t) {
    t->n = 0;
    for (int o = 0; o < DL_MAX_DEVICES && t->n < 4; o++) {
        int dev;
        uint64_t bytes, aux;
        if (!dl_rec_take(DL_REC_EXEC, gkey(g, o), &dev, &bytes, &aux)) continue;
        atomic_fetch_sub(&dl_graphmem_pending, 1);
        int k = t->n++;
        t->ordinal[k] = o;
        t->bytes[k] = bytes;
        /* What the graph memory pool already holds unused is not charged twice. */
        uint64_t reserved = 0, free_in_pool = 0, used = 0;
        if (read_graphmem(o, &reserved) == 0 && graphmem_attr(o, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) == 0 &&
            reserved > used)
            free_in_pool = reserved - used;
        CUresult r = dl_charge(o, bytes > free_in_pool ? bytes - free_in_pool : 0, &t->c[k]);
        if (r != CUDA_SUCCESS) {
            t->c[k].bytes = 0;
            dl_graphmem_after_launch(g, r, t); /* puts every record back for a later try */
            t->n = 0;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

void dl_graphmem_after_launch(CUgraphExec g, CUresult r, struct dl_graph_ticket *t) {
    for (int i = 0; i < t->n; i++) {
        if (r != CUDA_SUCCESS) {
            dl_refund(&t->c[i]);
            dl_rec_put(DL_REC_EXEC, gkey(g, t->ordinal[i]), t->ordinal[i], t->bytes[i], 0);
            atomic_fetch_add(&dl_graphmem_pending, 1);
            continue;
        }
        /* The memory exists now: charge what the pool holds, over the limit or not (logged). */
        if (sync_graphmem(t->ordinal[i], &t->c[i], 0) != 0)
            dl_warn("graph memory on device %d could not be charged", t->ordinal[i]);
    }
}

static CUresult upload(CUgraphExec g, CUstream s, PFN_cuGraphUpload_v11010 call) {
    struct dl_graph_ticket t = {.n = 0};
    if (atomic_load_explicit(&dl_graphmem_pending, memory_order_relaxed)) {
        CUresult a = dl_graphmem_before_launch(g, &t);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r = call(g, s);
    dl_graphmem_after_launch(g, r, &t);
    return r;
}

DL_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
    REAL_OR_NOT_FOUND(cuGraphUpload);
    return upload(hGraphExec, hStream, dl_cuda.cuGraphUpload);
}

DL_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    REAL_OR_NOT_FOUND(cuGraphUpload_ptsz);
    return upload(hGraphExec, hStream, dl_cuda.cuGraphUpload_ptsz);
}

static void sync_all_graphmem(void) {
    if (!atomic_load(&graphmem_used)) return;
    for (int o = 0; o < DL_MAX_DEVICES; o++)
        if (graph_known(o)) sync_graphmem(o, NULL, 0);
}

DL_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    REAL_OR_NOT_FOUND(cuGraphExecDestroy);
    CUresult r = dl_cuda.cuGraphExecDestroy(hGraphExec);
    if (r == CUDA_SUCCESS) {
        int n = graph_move(DL_REC_EXEC, hGraphExec, 0, NULL, 0);
        if (n) atomic_fetch_sub(&dl_graphmem_pending, n);
        sync_all_graphmem();
    }
    return r;
}

DL_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
    REAL_OR_NOT_FOUND(cuGraphDestroy);
    CUresult r = dl_cuda.cuGraphDestroy(hGraph);
    if (r == CUDA_SUCCESS) graph_move(DL_REC_GRAPH, hGraph, 0, NULL, 0);
    return r;
}

DL_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
    REAL_OR_NOT_FOUND(cuDeviceGraphMemTrim);
    CUresult r = dl_cuda.cuDeviceGraphMemTrim(device);
    if (r == CUDA_SUCCESS && device >= 0 && device < DL_MAX_DEVICES && graph_known(device))
        sync_graphmem(device, NULL, 0);
    return r;
}

/* ---- pool management calls that change what a pool holds ---- */

DL_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    REAL_OR_NOT_FOUND(cuMemPoolTrimTo);
    CUresult r = dl_cuda.cuMemPoolTrimTo(pool, minBytesToKeep);
    int o = r == CUDA_SUCCESS ? pool_ordinal(pool) : -1;
    if (o >= 0) sync_pool(pool, o, NULL, 0);
    return r;
}

DL_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    REAL_OR_NOT_FOUND(cuMemPoolSetAttribute);
    CUresult r = dl_cuda.cuMemPoolSetAttribute(pool, attr, value);
    int o = r == CUDA_SUCCESS ? pool_ordinal(pool) : -1;
    if (o >= 0) sync_pool(pool, o, NULL, 0);
    return r;
}

DL_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    REAL_OR_NOT_FOUND(cuMemPoolDestroy);
    CUresult r = dl_cuda.cuMemPoolDestroy(pool);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_POOLS; i++) {
        if (pools[i].pool != pool) continue;
        if (pools[i].charged) dl_region_release(pools[i].dev, pools[i].charged);
        pools[i] = (struct pool_rec){0};
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- synchronisation points: where pools give back what they keep beyond their release threshold ---- */

/* After a synchronisation, what the pools released is refunded at once, so that the claim's other
 * processes can have it (in a process that uses no pool or graph memory: nothing but one flag load). */
static void reclaim_all(void) {
    for (int o = 0; o < DL_MAX_DEVICES; o++) {
        pthread_mutex_lock(&mu);
        int any = graphmem[o].dev != 0;
        for (int i = 0; i < MAX_POOLS && !any; i++) any = pools[i].pool && pools[i].ordinal == o;
        pthread_mutex_unlock(&mu);
        if (any) dl_pools_reclaim(o);
    }
}

DL_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    REAL_OR_NOT_FOUND(cuStreamSynchronize);
    CUresult r = dl_cuda.cuStreamSynchronize(hStream);
    if (r == CUDA_SUCCESS && dl_pools_active()) dl_pools_reclaim(dl_stream_ordinal(hStream, 0));
    return r;
}

DL_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
    REAL_OR_NOT_FOUND(cuStreamSynchronize_ptsz);
    CUresult r = dl_cuda.cuStreamSynchronize_ptsz(hStream);
    if (r == CUDA_SUCCESS && dl_pools_active()) dl_pools_reclaim(dl_stream_ordinal(hStream, 1));
    return r;
}

DL_EXPORT CUresult cuCtxSynchronize(void) {
    REAL_OR_NOT_FOUND(cuCtxSynchronize);
    CUresult r = dl_cuda.cuCtxSynchronize();
    if (r == CUDA_SUCCESS && dl_pools_active()) dl_pools_reclaim(dl_current_ordinal());
    return r;
}

DL_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    REAL_OR_NOT_FOUND(cuCtxSynchronize_v2);
    CUresult r = dl_cuda.cuCtxSynchronize_v2(ctx);
    if (r == CUDA_SUCCESS && dl_pools_active()) reclaim_all();
    return r;
}

DL_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
    REAL_OR_NOT_FOUND(cuEventSynchronize);
    CUresult r = dl_cuda.cuEventSynchronize(hEvent);
    if (r == CUDA_SUCCESS && dl_pools_active()) reclaim_all();
    return r;
}
