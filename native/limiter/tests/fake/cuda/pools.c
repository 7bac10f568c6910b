/*
 * Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync) and memory pools: each
 * device's default pool, its current pool (cuDeviceSetMemPool) and created ones. A pool keeps what is freed to
 * it, and gives what it holds beyond its release threshold back to the device at synchronisation points or on
 * cuMemPoolTrimTo, as the real driver; on a capturing stream an allocation is a node of the capture's graph
 * (graphs.c).
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdlib.h>

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

void release_pools_of(int device) {
    pthread_mutex_lock(&mu);
    pools_release(device);
    pthread_mutex_unlock(&mu);
}

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
