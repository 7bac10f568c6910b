/*
 * Graphs: kernel and memory nodes, instantiation, upload and launch (a graph runs its kernel nodes back to back
 * on the device's queue), and graph memory: the addresses of allocation nodes (and of stream-ordered
 * allocations during capture) take memory from the device's graph memory pool at the first upload or launch;
 * the pool keeps it until cuDeviceGraphMemTrim.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdlib.h>

struct CUgraphExec_st {
    unsigned magic;
    int device;
    uint64_t duration_ns;
    int alloc_dev;
    uint64_t alloc_bytes, persist_bytes;
    int live;
};

/* ---------------------------------------------------------------- graph memory */

/* A graph allocation (a node, or a stream-ordered allocation during capture): an address now, memory when
 * the graph is launched. One device per graph in this fake. Caller holds mu. */
CUresult graph_alloc(CUgraph g, int device, uint64_t bytes, CUdeviceptr *out) {
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
CUresult graph_free(CUgraph g, uint64_t addr) {
    struct alloc *a = alloc_find(addr, A_GRAPHVA);
    if (!a || a->handle != (uint64_t)(uintptr_t)g) return CUDA_ERROR_INVALID_VALUE;
    g->freed_bytes += a->bytes;
    a->kind = -1;
    return CUDA_SUCCESS;
}

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
