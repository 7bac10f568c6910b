/*
 * Device-memory cap: the allocation wrappers (ledger.c charges and remembers, ipc.c shares within the claim).
 *
 * Every allocation family is charged to the claim's region before the driver is called (so that
 * concurrent processes never overshoot) and refunded if the driver fails; over the limit the wrapper
 * returns CUDA_ERROR_OUT_OF_MEMORY and the driver is not called. The ledger remembers what each live
 * allocation charged, so the matching free/release/destroy gives back exactly that.
 *
 * What is charged: the requested size (cuMemAlloc, managed, async and pool allocations, cuMemCreate on a
 * device location); the pitch times height (cuMemAllocPitch, estimated with a 512-byte pitch, then
 * corrected to the driver's pitch); width x height x depth x element size summed over mip levels for
 * arrays (an estimate: the driver's tiled layout may round up; sparse and deferred-mapping arrays have no
 * memory of their own - what backs them comes from cuMemCreate). The current context's device is charged
 * for allocations that do not name one.
 *
 * Physical memory from cuMemCreate lives as long as its handle is unreleased *or* mapped somewhere: the
 * common idiom (llama.cpp's VMM pool, the CUDA samples) maps it and releases the handle at once. So a
 * handle's charge is reference-counted like the driver's object - cuMemCreate and each
 * cuMemRetainAllocationHandle and cuMemMap take a reference, cuMemRelease and cuMemUnmap drop one - and
 * refunded when the last one goes.
 *
 * Out-parameters are never read before the driver has succeeded, and a NULL out-parameter is passed to
 * the driver untouched (it answers with its own error).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "devices.h"
#include "driver.h"
#include "init.h"
#include "ledger.h"
#include "pools.h"
#include "region.h"

#define current_ordinal dl_current_ordinal

#define REAL_OR_NOT_FOUND(name)                                                                                        \
    dl_cuda_init();                                                                                                    \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND

/* Frees: forget the charge before the driver call, so an address the driver hands out again at once
 * cannot meet our stale entry; restore it if the driver refuses. */
#define FREE_WRAPPER(kind, key, call)                                                                                  \
    int dev_ = -1;                                                                                                     \
    uint64_t shared_ = 0, bytes_ = (key) ? dl_untrack(kind, key, &dev_, &shared_) : 0;                                 \
    CUresult r_ = call;                                                                                                \
    if (bytes_) {                                                                                                      \
        if (r_ == CUDA_SUCCESS) dl_release_charge(dev_, bytes_, shared_);                                              \
        else dl_track_shared(kind, key, dev_, bytes_, shared_);                                                        \
    }                                                                                                                  \
    return r_

/* The allocations that return a device pointer for `bytesize` bytes on the current device; the
 * arguments after the name are the driver call's. */
#define CHARGED_ALLOC(name, ...)                                                                                       \
    REAL_OR_NOT_FOUND(name);                                                                                           \
    if (!dptr || bytesize == 0) return dl_cuda.name(__VA_ARGS__);                                                      \
    struct dl_charge c;                                                                                                \
    CUresult r = dl_charge(current_ordinal(), bytesize, &c);                                                           \
    if (r != CUDA_SUCCESS) return r;                                                                                   \
    r = dl_cuda.name(__VA_ARGS__);                                                                                     \
    dl_settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);                                                            \
    return r

DL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { CHARGED_ALLOC(cuMemAlloc_v2, dptr, bytesize); }

DL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CHARGED_ALLOC(cuMemAllocManaged, dptr, bytesize, flags);
}

#define PITCH_ESTIMATE 512u

DL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    REAL_OR_NOT_FOUND(cuMemAllocPitch_v2);
    size_t row = (WidthInBytes + PITCH_ESTIMATE - 1) / PITCH_ESTIMATE * PITCH_ESTIMATE;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 || row < WidthInBytes || row > SIZE_MAX / Height)
        return dl_cuda.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct dl_charge c;
    CUresult r = dl_charge(current_ordinal(), (uint64_t)row * Height, &c);
    if (r != CUDA_SUCCESS) return r;
    r = dl_cuda.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r == CUDA_SUCCESS && c.bytes && *pPitch != row && *pPitch <= SIZE_MAX / Height) {
        /* Settle on the driver's actual pitch (no limit check: the memory exists now). */
        uint64_t actual = dl_round_granule(current_ordinal(), (uint64_t)*pPitch * Height);
        if (actual > c.bytes) {
            if (dl_region_reserve(c.dev, actual - c.bytes, DL_NO_LIMIT) == 0) c.bytes = actual;
        } else {
            dl_region_release(c.dev, c.bytes - actual);
            c.bytes = actual;
        }
    }
    dl_settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);
    return r;
}

/* A free of a pointer with no charge of its own (a pool's or a graph's): what holds its memory is settled
 * after the driver call. */
#define POOL_FREE(call)                                                                                                \
    struct dl_pool_free pf_;                                                                                           \
    dl_pools_before_free(dptr, &pf_);                                                                                  \
    CUresult r_ = call;                                                                                                \
    dl_pools_after_free(&pf_, r_);                                                                                     \
    return r_

/* Frees: the common case (a charged pointer) first, without touching the pools. */
#define FREE_PTR(call)                                                                                                 \
    int dev_ = -1;                                                                                                     \
    uint64_t shared_ = 0, bytes_ = dptr ? dl_untrack(K_PTR, dptr, &dev_, &shared_) : 0;                                \
    if (DL_LIKELY(bytes_)) {                                                                                           \
        CUresult r_ = call;                                                                                            \
        if (r_ == CUDA_SUCCESS) dl_release_charge(dev_, bytes_, shared_);                                              \
        else dl_track_shared(K_PTR, dptr, dev_, bytes_, shared_);                                                      \
        return r_;                                                                                                     \
    }                                                                                                                  \
    POOL_FREE(call)

DL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuMemFree_v2);
    FREE_PTR(dl_cuda.cuMemFree_v2(dptr));
}

/* Stream-ordered allocations are charged by pools.c (to the device they land on, as the pool holds them);
 * the four entry points differ only in how they reach the driver. */
static CUresult ordered_call(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int variant) {
    switch (variant) {
        case 0:
            return dl_cuda.cuMemAllocAsync(dptr, bytes, s);
        case 1:
            return dl_cuda.cuMemAllocAsync_ptsz(dptr, bytes, s);
        case 2:
            return dl_cuda.cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
        default:
            return dl_cuda.cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, s);
    }
}

#define ORDERED_ALLOC(name, pool, variant)                                                                             \
    REAL_OR_NOT_FOUND(name);                                                                                           \
    if (!dptr || bytesize == 0) return ordered_call(dptr, bytesize, pool, hStream, variant);                           \
    return dl_ordered_alloc(dptr, bytesize, pool, hStream, variant, ordered_call)

DL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocAsync, NULL, 0);
}
DL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocAsync_ptsz, NULL, 1);
}
DL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocFromPoolAsync, pool, 2);
}
DL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocFromPoolAsync_ptsz, pool, 3);
}
DL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    REAL_OR_NOT_FOUND(cuMemFreeAsync);
    FREE_PTR(dl_cuda.cuMemFreeAsync(dptr, hStream));
}
DL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    REAL_OR_NOT_FOUND(cuMemFreeAsync_ptsz);
    FREE_PTR(dl_cuda.cuMemFreeAsync_ptsz(dptr, hStream));
}

DL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuMemCreate);
    /* Only device-resident physical memory counts; host and host-NUMA locations do not. */
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return dl_cuda.cuMemCreate(handle, size, prop, flags);
    struct dl_charge c;
    CUresult r = dl_charge(prop->location.id, size, &c);
    if (r != CUDA_SUCCESS) return r;
    r = dl_cuda.cuMemCreate(handle, size, prop, flags);
    dl_settle(r, K_HANDLE, r == CUDA_SUCCESS ? *handle : 0, &c);
    return r;
}

/* Releases and unmaps drop their references before the driver call (as frees forget theirs), so that a
 * handle value the driver hands out again at once cannot meet our stale entry; undone if it refuses. */
DL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_NOT_FOUND(cuMemRelease);
    int dev = -1, known;
    uint64_t shared = 0, bytes = dl_handle_unref(handle, &dev, &known, &shared);
    CUresult r = dl_cuda.cuMemRelease(handle);
    if (r != CUDA_SUCCESS) dl_handle_unref_undo(handle, known, dev, bytes, shared);
    else if (bytes) dl_release_charge(dev, bytes, shared);
    if (r == CUDA_SUCCESS && !known) dl_rec_take(DL_REC_IMPORT, handle, NULL, NULL, NULL); /* never mapped */
    return r;
}

static uint64_t format_bytes(CUarray_format f, unsigned channels) {
    uint64_t ch = channels ? channels : 1;
    switch (f) {
        case CU_AD_FORMAT_UNSIGNED_INT8:
        case CU_AD_FORMAT_SIGNED_INT8:
            return ch;
        case CU_AD_FORMAT_UNSIGNED_INT16:
        case CU_AD_FORMAT_SIGNED_INT16:
        case CU_AD_FORMAT_HALF:
            return 2 * ch;
        case CU_AD_FORMAT_UNSIGNED_INT32:
        case CU_AD_FORMAT_SIGNED_INT32:
        case CU_AD_FORMAT_FLOAT:
            return 4 * ch;
        case CU_AD_FORMAT_UNORM_INT8X1:
        case CU_AD_FORMAT_SNORM_INT8X1:
            return 1;
        case CU_AD_FORMAT_UNORM_INT8X2:
        case CU_AD_FORMAT_SNORM_INT8X2:
            return 2;
        case CU_AD_FORMAT_UNORM_INT8X4:
        case CU_AD_FORMAT_SNORM_INT8X4:
            return 4;
        case CU_AD_FORMAT_UNORM_INT16X1:
        case CU_AD_FORMAT_SNORM_INT16X1:
            return 2;
        case CU_AD_FORMAT_UNORM_INT16X2:
        case CU_AD_FORMAT_SNORM_INT16X2:
            return 4;
        case CU_AD_FORMAT_UNORM_INT16X4:
        case CU_AD_FORMAT_SNORM_INT16X4:
            return 8;
        default:
            return 16;
    }
}

/* w*h*d*elem with saturation (a saturated size is refused by the limit, as the driver would). */
static uint64_t volume(uint64_t w, uint64_t h, uint64_t d, uint64_t elem) {
    uint64_t v = w ? w : 1;
    const uint64_t f[3] = {h ? h : 1, d ? d : 1, elem};
    for (int i = 0; i < 3; i++) {
        if (v > UINT64_MAX / f[i]) return UINT64_MAX;
        v *= f[i];
    }
    return v;
}

/* What an array of descriptor d (2D: depth 1) holds. */
#define ARRAY_BYTES(d, depth) volume((d)->Width, (d)->Height, depth, format_bytes((d)->Format, (d)->NumChannels))

/* Creates an object (an array, a mipmapped array) whose memory, `bytes`, lands on the current device:
 * charged first, refunded if the driver refuses, remembered under the handle the driver puts in *pHandle. */
#define CHARGED_OBJECT(kind, bytes, call)                                                                              \
    struct dl_charge c;                                                                                                \
    CUresult r = dl_charge(current_ordinal(), (bytes), &c);                                                            \
    if (r != CUDA_SUCCESS) return r;                                                                                   \
    r = call;                                                                                                          \
    dl_settle(r, kind, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, &c);                                     \
    return r

DL_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    REAL_OR_NOT_FOUND(cuArrayCreate_v2);
    if (!pHandle || !pAllocateArray) return dl_cuda.cuArrayCreate_v2(pHandle, pAllocateArray);
    CHARGED_OBJECT(K_ARRAY, ARRAY_BYTES(pAllocateArray, 1), dl_cuda.cuArrayCreate_v2(pHandle, pAllocateArray));
}

/* Sparse and deferred-mapping arrays are created without memory: what backs them is mapped later from
 * cuMemCreate allocations, which are charged. */
#define UNBACKED_ARRAY(d) (((d)->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0)

DL_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    REAL_OR_NOT_FOUND(cuArray3DCreate_v2);
    if (!pHandle || !pAllocateArray || UNBACKED_ARRAY(pAllocateArray))
        return dl_cuda.cuArray3DCreate_v2(pHandle, pAllocateArray);
    CHARGED_OBJECT(K_ARRAY, ARRAY_BYTES(pAllocateArray, pAllocateArray->Depth),
                   dl_cuda.cuArray3DCreate_v2(pHandle, pAllocateArray));
}

DL_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                          unsigned int numMipmapLevels) {
    REAL_OR_NOT_FOUND(cuMipmappedArrayCreate);
    if (!pHandle || !pMipmappedArrayDesc || UNBACKED_ARRAY(pMipmappedArrayDesc))
        return dl_cuda.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    uint64_t elem = format_bytes(d->Format, d->NumChannels), total = 0;
    uint64_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < numMipmapLevels && l < 64; l++) {
        uint64_t v = volume(w, h, z, elem);
        total = v > UINT64_MAX - total ? UINT64_MAX : total + v;
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    CHARGED_OBJECT(K_MIPMAP, total, dl_cuda.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels));
}

DL_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
    REAL_OR_NOT_FOUND(cuArrayDestroy);
    FREE_WRAPPER(K_ARRAY, (uint64_t)(uintptr_t)hArray, dl_cuda.cuArrayDestroy(hArray));
}

DL_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    REAL_OR_NOT_FOUND(cuMipmappedArrayDestroy);
    FREE_WRAPPER(K_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray, dl_cuda.cuMipmappedArrayDestroy(hMipmappedArray));
}

/* ---- the capped view ---- */

/* The current device's (total, free) as the claim sees them, from the driver's figures (UINT64_MAX for one
 * not asked); 0 where no cap applies and the driver's figures stand. */
static int capped_mem_info(uint64_t real_total, uint64_t real_free, uint64_t *total, uint64_t *free_bytes) {
    dl_core_init();
    uint64_t limit;
    int ordinal = current_ordinal();
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0 || limit == DL_NO_LIMIT) return 0;
    dl_pools_reclaim(ordinal); /* the free view counts what pools still hold, no more */
    dl_capped_view(dev, limit, real_total, real_free, total, free_bytes);
    return 1;
}

DL_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    REAL_OR_NOT_FOUND(cuMemGetInfo_v2);
    CUresult r = dl_cuda.cuMemGetInfo_v2(free_bytes, total);
    if (r != CUDA_SUCCESS || (!free_bytes && !total)) return r;
    uint64_t t, f;
    if (!capped_mem_info(total ? *total : UINT64_MAX, free_bytes ? *free_bytes : UINT64_MAX, &t, &f)) return r;
    if (total) *total = (size_t)t;
    if (free_bytes) *free_bytes = (size_t)f;
    return r;
}

DL_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDeviceTotalMem_v2);
    CUresult r = dl_cuda.cuDeviceTotalMem_v2(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes) return r;
    dl_core_init();
    uint64_t limit;
    if (dl_device_for_ordinal((int)dev, &limit) >= 0 && limit < *bytes) *bytes = (size_t)limit;
    return r;
}

/* ---- the CUDA 2.0 ABI: what cuGetProcAddress returns to a caller asking for a version before 3.2 ---- */

DL_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CHARGED_ALLOC(cuMemAlloc, dptr, bytesize);
}

DL_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                   unsigned int Height, unsigned int ElementSizeBytes) {
    REAL_OR_NOT_FOUND(cuMemAllocPitch);
    uint64_t row = ((uint64_t)WidthInBytes + PITCH_ESTIMATE - 1) / PITCH_ESTIMATE * PITCH_ESTIMATE;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return dl_cuda.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct dl_charge c;
    CUresult r = dl_charge(current_ordinal(), row * Height, &c);
    if (r != CUDA_SUCCESS) return r;
    r = dl_cuda.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r == CUDA_SUCCESS && c.bytes) {
        uint64_t actual = dl_round_granule(current_ordinal(), (uint64_t)*pPitch * Height);
        if (actual > c.bytes) {
            if (dl_region_reserve(c.dev, actual - c.bytes, DL_NO_LIMIT) == 0) c.bytes = actual;
        } else if (actual < c.bytes) {
            dl_region_release(c.dev, c.bytes - actual);
            c.bytes = actual;
        }
    }
    dl_settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);
    return r;
}

DL_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    REAL_OR_NOT_FOUND(cuMemFree);
    FREE_PTR(dl_cuda.cuMemFree(dptr));
}

static unsigned int clamp32(uint64_t v) { return v > 0xffffffffull ? 0xffffffffu : (unsigned int)v; }

DL_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    REAL_OR_NOT_FOUND(cuMemGetInfo);
    CUresult r = dl_cuda.cuMemGetInfo(free_bytes, total);
    if (r != CUDA_SUCCESS || (!free_bytes && !total)) return r;
    uint64_t t, f;
    if (!capped_mem_info(total ? *total : UINT64_MAX, free_bytes ? *free_bytes : UINT64_MAX, &t, &f)) return r;
    if (total) *total = clamp32(t);
    if (free_bytes) *free_bytes = clamp32(f);
    return r;
}

DL_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDeviceTotalMem);
    CUresult r = dl_cuda.cuDeviceTotalMem(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes) return r;
    dl_core_init();
    uint64_t limit;
    if (dl_device_for_ordinal((int)dev, &limit) >= 0 && limit < *bytes) *bytes = (unsigned int)limit;
    return r;
}

DL_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray) {
    REAL_OR_NOT_FOUND(cuArrayCreate);
    if (!pHandle || !pAllocateArray) return dl_cuda.cuArrayCreate(pHandle, pAllocateArray);
    CHARGED_OBJECT(K_ARRAY, ARRAY_BYTES(pAllocateArray, 1), dl_cuda.cuArrayCreate(pHandle, pAllocateArray));
}

DL_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray) {
    REAL_OR_NOT_FOUND(cuArray3DCreate);
    if (!pHandle || !pAllocateArray || UNBACKED_ARRAY(pAllocateArray))
        return dl_cuda.cuArray3DCreate(pHandle, pAllocateArray);
    CHARGED_OBJECT(K_ARRAY, ARRAY_BYTES(pAllocateArray, pAllocateArray->Depth),
                   dl_cuda.cuArray3DCreate(pHandle, pAllocateArray));
}
