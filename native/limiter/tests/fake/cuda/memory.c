/*
 * Device memory: the table of everything that holds an address or a handle (plain allocations here; pool,
 * graph, VMM and IPC entries from pools.c, graphs.c, vmm.c and ipc.c), cuMemAlloc and its relatives in every
 * ABI (the CUDA 2.0 ones with 32-bit sizes and addresses below 4 GiB), cuMemGetInfo, pointer attributes and
 * arrays. Every allocation holds whole granules of the device's memory, one beyond it fails with
 * CUDA_ERROR_OUT_OF_MEMORY, and cuMemGetInfo tells the truth: the accounting the limiter's memory cap is
 * checked against.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdlib.h>

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

/* ---------------------------------------------------------------- the allocation table */

/* Open addressing on (key, kind), linear probing; rebuilt when half its slots have been used. Under mu. */
static struct alloc *allocs;
static size_t allocs_cap, allocs_used;
static uint64_t next_addr[FAKE_MAX_DEVICES];

static size_t ahash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

struct alloc *alloc_find(uint64_t key, int kind) {
    if (!allocs_cap) return NULL;
    for (size_t i = ahash(key) & (allocs_cap - 1), n = 0; n < allocs_cap; n++, i = (i + 1) & (allocs_cap - 1)) {
        if (allocs[i].kind == 0) return NULL;
        if (allocs[i].kind == kind && allocs[i].key == key) return &allocs[i];
    }
    return NULL;
}

int alloc_put(struct alloc a) {
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

struct alloc *alloc_next(size_t *cursor, int kind) {
    for (; *cursor < allocs_cap; ++*cursor)
        if (allocs[*cursor].kind == kind) return &allocs[(*cursor)++];
    return NULL;
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
uint64_t new_addr(int device, uint64_t bytes, int low) {
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
CUresult device_free(uint64_t addr, int kind) {
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

/* cuMemFree and cuMemFree_v2 after their own COUNT (each call is counted under its own name). */
static CUresult mem_free(CUdeviceptr p) {
    CHECK(1);
    if (!p) return CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    CUresult r = device_free(p, A_DEVICE);
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemFree(unsigned int p) {
    COUNT();
    return mem_free(p);
}

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
    return mem_free(p);
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
