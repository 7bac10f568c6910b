/*
 * Device memory that contexts hold: a context reserves, on its device, the stack of every thread the
 * device can keep resident (CU_LIMIT_STACK_SIZE per thread x multiprocessors x threads per
 * multiprocessor), the device malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE) and the printf FIFO
 * (CU_LIMIT_PRINTF_FIFO_SIZE). These are charged to the claim, rounded to the allocation granularity:
 *
 *   - the primary context when the process first retains it (released when its last retain is),
 *   - each context made by cuCtxCreate (every ABI variant; released by cuCtxDestroy(_v2)),
 *   - cuCtxSetLimit's growth, before the driver call (over the limit: CUDA_ERROR_OUT_OF_MEMORY, and the
 *     driver is not called), settled on what the driver then reports.
 *
 * A context the claim cannot afford is given back at once and the call answers CUDA_ERROR_OUT_OF_MEMORY.
 * No lock is held across a driver call: the primary contexts' retain counts are atomics, charges are kept
 * in memory.c's table keyed by context. Before a context goes, the compute limiter drops the timing events
 * it keeps for it (a new context may get the same address).
 */
#define _GNU_SOURCE
#include <string.h>

#include "limiter.h"

static struct {
    _Atomic int refs;           /* this process's retains of the device's primary context */
    _Atomic(CUcontext) ctx;
} primary[DL_MAX_DEVICES];

_Atomic unsigned dl_ctx_epoch;

void dl_contexts_reset_after_fork(void) { memset(primary, 0, sizeof primary); }

#define REAL_OR_NOT_FOUND(name) \
    dl_cuda_init();             \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND

static int attribute(CUdevice_attribute a, int ordinal) {
    int v = 0;
    if (!dl_cuda.cuDeviceGetAttribute || dl_cuda.cuDeviceGetAttribute(&v, a, ordinal) != CUDA_SUCCESS) return 0;
    return v;
}

/* What a context with these limits holds on its device. */
static uint64_t reserve_for(int ordinal, const uint64_t lim[3]) {
    uint64_t threads = (uint64_t)attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal) *
                       (uint64_t)attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, ordinal);
    uint64_t stack = threads && lim[0] > UINT64_MAX / threads ? UINT64_MAX : lim[0] * threads;
    uint64_t sum = stack;
    for (int i = 1; i < 3; i++) sum = lim[i] > UINT64_MAX - sum ? UINT64_MAX : sum + lim[i];
    return dl_round_granule(ordinal, sum);
}

static const CUlimit LIMITS[3] = {CU_LIMIT_STACK_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE};

/* The current context's limits; -1 when the driver cannot tell them. */
static int current_limits(uint64_t lim[3]) {
    for (int i = 0; i < 3; i++) {
        size_t v = 0;
        if (!dl_cuda.cuCtxGetLimit || dl_cuda.cuCtxGetLimit(&v, LIMITS[i]) != CUDA_SUCCESS) return -1;
        lim[i] = v;
    }
    return 0;
}

/* What ctx holds now (made current around the reading when it is not). */
static uint64_t context_bytes(CUcontext ctx, int ordinal) {
    CUcontext cur = NULL, popped;
    uint64_t lim[3];
    if (dl_cuda.cuCtxGetCurrent) dl_cuda.cuCtxGetCurrent(&cur);
    int pushed = 0;
    if (cur != ctx) {
        if (!dl_cuda.cuCtxPushCurrent_v2 || dl_cuda.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) return 0;
        pushed = 1;
    }
    int ok = current_limits(lim) == 0;
    if (pushed) dl_cuda.cuCtxPopCurrent_v2(&popped);
    return ok ? reserve_for(ordinal, lim) : 0;
}

/* Charges a new context; CUDA_ERROR_OUT_OF_MEMORY when the claim cannot hold it. */
static CUresult charge_context(CUcontext ctx, int ordinal) {
    struct dl_charge c;
    CUresult r = dl_charge(ordinal, context_bytes(ctx, ordinal), &c);
    if (r != CUDA_SUCCESS) return r;
    if (c.bytes) dl_rec_put(DL_REC_CTX, (uint64_t)(uintptr_t)ctx, c.dev, c.bytes, 0);
    return CUDA_SUCCESS;
}

static void refund_context(CUcontext ctx) {
    int dev;
    uint64_t bytes, aux;
    if (dl_rec_take(DL_REC_CTX, (uint64_t)(uintptr_t)ctx, &dev, &bytes, &aux)) dl_region_release(dev, bytes);
}

DL_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxRetain);
    CUresult r = dl_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r != CUDA_SUCCESS || !pctx || dev < 0 || dev >= DL_MAX_DEVICES) return r;
    if (atomic_fetch_add(&primary[dev].refs, 1) != 0) return r;
    atomic_store(&primary[dev].ctx, *pctx);
    dl_core_init();
    if (charge_context(*pctx, dev) == CUDA_SUCCESS) return r;
    /* The claim cannot hold the context: give it back. */
    atomic_fetch_sub(&primary[dev].refs, 1);
    if (dl_cuda.cuDevicePrimaryCtxRelease_v2) dl_cuda.cuDevicePrimaryCtxRelease_v2(dev);
    dl_info("refusing the primary context of device %d: its memory would exceed the claim's limit", dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The primary context of a device, without changing its reference count; NULL when it cannot be told. */
static CUcontext primary_of(CUdevice dev) {
    CUcontext ctx = dev >= 0 && dev < DL_MAX_DEVICES ? atomic_load(&primary[dev].ctx) : NULL;
    if (ctx) return ctx;
    if (!dl_cuda.cuDevicePrimaryCtxRetain || !dl_cuda.cuDevicePrimaryCtxRelease_v2 ||
        dl_cuda.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
        return NULL;
    dl_cuda.cuDevicePrimaryCtxRelease_v2(dev);
    return ctx;
}

/* Each entry point below has a CUDA 2.0 or 7.0 variant of the same ABI that cuGetProcAddress returns to a
 * caller asking for an older version: both go through one function, with the driver's exact variant. */
typedef CUresult (*device_call)(CUdevice);
typedef CUresult (*context_call)(CUcontext);

static CUresult primary_release(CUdevice dev, device_call call) {
    /* The last release destroys it; which release is the last, only the driver knows. Spare timing events
     * are cheap to make again, so every release lets them go. */
    CUcontext doomed = primary_of(dev);
    if (doomed) dl_throttle_forget_context(doomed);
    CUresult r = call(dev);
    if (r != CUDA_SUCCESS || dev < 0 || dev >= DL_MAX_DEVICES) return r;
    int refs = atomic_load(&primary[dev].refs);
    while (refs > 0 && !atomic_compare_exchange_weak(&primary[dev].refs, &refs, refs - 1)) {
    }
    if (refs == 1) {
        atomic_fetch_add(&dl_ctx_epoch, 1);
        refund_context(atomic_load(&primary[dev].ctx));
    }
    return r;
}

DL_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxRelease_v2);
    return primary_release(dev, dl_cuda.cuDevicePrimaryCtxRelease_v2);
}

DL_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxRelease);
    return primary_release(dev, dl_cuda.cuDevicePrimaryCtxRelease);
}

static CUresult primary_reset(CUdevice dev, device_call call) {
    dl_throttle_forget_context(primary_of(dev)); /* NULL: cannot tell which, forget them all */
    CUresult r = call(dev);
    if (r != CUDA_SUCCESS || dev < 0 || dev >= DL_MAX_DEVICES) return r;
    atomic_fetch_add(&dl_ctx_epoch, 1);
    if (atomic_exchange(&primary[dev].refs, 0) > 0) refund_context(atomic_load(&primary[dev].ctx));
    return r;
}

DL_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxReset_v2);
    return primary_reset(dev, dl_cuda.cuDevicePrimaryCtxReset_v2);
}

DL_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxReset);
    return primary_reset(dev, dl_cuda.cuDevicePrimaryCtxReset);
}

/* A created context is current to the calling thread; one the claim cannot hold is destroyed again. */
static CUresult created(CUresult r, CUcontext *pctx, CUdevice dev) {
    if (r != CUDA_SUCCESS || !pctx) return r;
    dl_core_init();
    if (charge_context(*pctx, dev) == CUDA_SUCCESS) return r;
    if (dl_cuda.cuCtxDestroy_v2) dl_cuda.cuCtxDestroy_v2(*pctx);
    dl_info("refusing a context on device %d: its memory would exceed the claim's limit", dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

DL_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate);
    return created(dl_cuda.cuCtxCreate(pctx, flags, dev), pctx, dev);
}

DL_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v2);
    return created(dl_cuda.cuCtxCreate_v2(pctx, flags, dev), pctx, dev);
}

DL_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v3);
    return created(dl_cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev), pctx, dev);
}

DL_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v4);
    return created(dl_cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev), pctx, dev);
}

static CUresult destroy(CUcontext ctx, context_call call) {
    if (ctx) dl_throttle_forget_context(ctx); /* its timing events die with it */
    CUresult r = call(ctx);
    if (r == CUDA_SUCCESS) {
        atomic_fetch_add(&dl_ctx_epoch, 1);
        refund_context(ctx);
    }
    return r;
}

DL_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    REAL_OR_NOT_FOUND(cuCtxDestroy_v2);
    return destroy(ctx, dl_cuda.cuCtxDestroy_v2);
}

DL_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
    REAL_OR_NOT_FOUND(cuCtxDestroy);
    return destroy(ctx, dl_cuda.cuCtxDestroy);
}

DL_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    REAL_OR_NOT_FOUND(cuCtxSetLimit);
    int which = limit == CU_LIMIT_STACK_SIZE ? 0 : limit == CU_LIMIT_MALLOC_HEAP_SIZE ? 1
              : limit == CU_LIMIT_PRINTF_FIFO_SIZE ? 2 : -1;
    CUcontext ctx = NULL;
    uint64_t lim[3];
    int ordinal = dl_current_ordinal();
    if (which < 0 || ordinal < 0 || !dl_cuda.cuCtxGetCurrent || dl_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        !ctx || current_limits(lim) != 0)
        return dl_cuda.cuCtxSetLimit(limit, value);
    dl_core_init();
    uint64_t before = reserve_for(ordinal, lim);
    lim[which] = value;
    uint64_t after = reserve_for(ordinal, lim);
    struct dl_charge c = {.dev = -1, .bytes = 0};
    if (after > before) {
        CUresult a = dl_charge(ordinal, after - before, &c);
        if (a != CUDA_SUCCESS) return a;
    }
    CUresult r = dl_cuda.cuCtxSetLimit(limit, value);
    if (r != CUDA_SUCCESS) {
        dl_refund(&c);
        return r;
    }
    /* Settle on what the context holds now (the driver may round the value). */
    int dev;
    uint64_t held = 0, aux;
    if (!dl_rec_take(DL_REC_CTX, (uint64_t)(uintptr_t)ctx, &dev, &held, &aux)) dev = c.dev;
    uint64_t now = current_limits(lim) == 0 ? reserve_for(ordinal, lim) : after;
    uint64_t have = held + c.bytes;
    if (dev < 0) dev = dl_device_for_ordinal(ordinal, NULL);
    if (dev < 0) return r;
    if (now > have) {
        if (dl_region_reserve(dev, now - have, DL_NO_LIMIT) == 0) have = now;
    } else if (now < have) {
        dl_region_release(dev, have - now);
        have = now;
    }
    if (have) dl_rec_put(DL_REC_CTX, (uint64_t)(uintptr_t)ctx, dev, have, 0);
    return r;
}
