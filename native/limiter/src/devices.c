/*
 * Which device a call is about: a CUDA ordinal's region entry and limit (through the device's UUID, resolved once
 * per process), the current context's and a stream's ordinal, the device's allocation granularity, and the capped
 * (total, free) view that the CUDA and NVML queries share.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "devices.h"
#include "fork.h"
#include "arbiter.h"
#include "capture.h"
#include "common.h"
#include "driver.h"
#include "init.h"
#include "claim_limits.h"
#include "log.h"
#include "region.h"

_Atomic unsigned dl_ctx_epoch;

/* ---- per-device resolution: CUDA ordinal -> UUID -> region entry and limit ---- */

static _Atomic int dev_index[DL_MAX_DEVICES]; /* region index + 1; 0 = not resolved yet */
static _Atomic uint64_t dev_limit[DL_MAX_DEVICES];

/* 0 with the device's UUID; -1 when the driver cannot tell it now (not initialised, no such device): the
 * caller then charges nothing and caches nothing, and the driver answers the call with its own error. */
static int ordinal_uuid(int ordinal, char uuid[DL_UUID_LEN]) {
    CUuuid u;
    if (!dl_cuda.cuDeviceGetUuid_v2) {
        /* A driver older than CUDA 11.4: the ordinal is the best key we have. */
        snprintf(uuid, DL_UUID_LEN, "CUDA-ORDINAL-%d", ordinal);
        return 0;
    }
    if (dl_cuda.cuDeviceGetUuid_v2(&u, ordinal) != CUDA_SUCCESS) return -1;
    dl_uuid_format((const unsigned char *)u.bytes, uuid);
    return 0;
}

/* No lock: a driver call and a (bounded) file lock are involved, so threads that race here each resolve
 * the device - the answer is the same - and the first to finish publishes it. */
int dl_device_for_ordinal(int ordinal, uint64_t *limit) {
    if (ordinal < 0 || ordinal >= DL_MAX_DEVICES) return -1;
    int idx = atomic_load_explicit(&dev_index[ordinal], memory_order_acquire);
    if (DL_UNLIKELY(idx == 0)) {
        char uuid[DL_UUID_LEN];
        if (ordinal_uuid(ordinal, uuid) != 0) return -1;
        int r = dl_region_device(uuid);
        dl_arbiter_bind(r, uuid);
        uint64_t lim = dl_device_limit(ordinal, uuid);
        atomic_store_explicit(&dev_limit[ordinal], lim, memory_order_relaxed);
        int expected = 0;
        if (atomic_compare_exchange_strong_explicit(&dev_index[ordinal], &expected, r < 0 ? -1 : r + 1,
                                                    memory_order_release, memory_order_acquire)) {
            if (lim != DL_NO_LIMIT)
                dl_debug("device %d (%s): memory limit %llu bytes", ordinal, uuid, (unsigned long long)lim);
        }
        idx = atomic_load_explicit(&dev_index[ordinal], memory_order_acquire);
    }
    if (limit) *limit = atomic_load_explicit(&dev_limit[ordinal], memory_order_relaxed);
    return idx < 0 ? -1 : idx - 1;
}

int dl_current_ordinal(void) {
    CUdevice d;
    if (!dl_cuda.cuCtxGetDevice || dl_cuda.cuCtxGetDevice(&d) != CUDA_SUCCESS) return -1;
    return (int)d;
}

/* The legacy and per-thread default streams, which cuda.h defines as small handle values. */
#define IS_DEFAULT_STREAM(s) ((uintptr_t)(s) <= 2u)

int dl_stream_ordinal(CUstream s, int ptsz) {
    if (IS_DEFAULT_STREAM(s)) return dl_current_ordinal();
    /* Asked first, and only while a capture is open: a capturing stream is not asked about (devices.h). */
    if (dl_captures_open() && dl_stream_capture_status(s, ptsz) != 0) return dl_current_ordinal();
    PFN_cuStreamGetDevice_v12080 get = ptsz ? dl_cuda.cuStreamGetDevice_ptsz : dl_cuda.cuStreamGetDevice;
    CUdevice d;
    if (get && get(s, &d) == CUDA_SUCCESS) return (int)d;
    /* A driver older than 12.8: through the stream's context. */
    PFN_cuStreamGetCtx_v9020 get_ctx = ptsz ? dl_cuda.cuStreamGetCtx_ptsz : dl_cuda.cuStreamGetCtx;
    CUcontext ctx;
    if (get_ctx && dl_cuda.cuCtxPushCurrent_v2 && dl_cuda.cuCtxPopCurrent_v2 && get_ctx(s, &ctx) == CUDA_SUCCESS &&
        dl_cuda.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
        int o = dl_current_ordinal();
        CUcontext popped;
        dl_cuda.cuCtxPopCurrent_v2(&popped);
        return o;
    }
    return dl_current_ordinal();
}

/* ---- allocation granularity: the driver hands out memory in these units, so charges are rounded up to
 * them (many small allocations cannot hold more than they are charged) ---- */

#define GRANULE_FALLBACK (2ull << 20) /* what current GPUs report; used when the driver cannot tell */
static _Atomic uint64_t granule[DL_MAX_DEVICES];

uint64_t dl_round_granule(int ordinal, uint64_t bytes) {
    if (ordinal < 0 || ordinal >= DL_MAX_DEVICES) return bytes;
    uint64_t g = atomic_load_explicit(&granule[ordinal], memory_order_relaxed);
    if (DL_UNLIKELY(g == 0)) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal;
        size_t v = 0;
        if (!dl_cuda.cuMemGetAllocationGranularity ||
            dl_cuda.cuMemGetAllocationGranularity(&v, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
            v == 0 || (v & (v - 1)) != 0)
            v = GRANULE_FALLBACK;
        g = v;
        atomic_store_explicit(&granule[ordinal], g, memory_order_relaxed);
    }
    return bytes > UINT64_MAX - (g - 1) ? UINT64_MAX : (bytes + g - 1) & ~(g - 1);
}

void dl_capped_view(int dev, uint64_t limit, uint64_t real_total, uint64_t real_free, uint64_t *total,
                    uint64_t *free_bytes) {
    uint64_t t = limit < real_total ? limit : real_total;
    uint64_t used = dev >= 0 ? dl_region_used(dev) : 0;
    if (used > t) used = t;
    uint64_t f = t - used;
    *total = t;
    *free_bytes = f < real_free ? f : real_free;
}

static void dl_devices_reset_after_fork(void) {
    for (int i = 0; i < DL_MAX_DEVICES; i++) atomic_store(&dev_index[i], 0);
}
DL_FORK_HANDLERS(DL_FORK_DEVICES, NULL, NULL, dl_devices_reset_after_fork);
