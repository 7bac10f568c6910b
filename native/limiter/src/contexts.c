/*
 * Device memory that contexts hold. A context takes far more than its limits account for: on an H100 with
 * driver 580 a bare context took 549 MB (523.6 MiB) by the driver's free-memory delta, against about
 * 282 MiB for its stack, heap and printf FIFO (tests/real-gpu/h100-driver-facts.txt). So a new context is
 * charged what the driver actually took for it:
 *
 *   - the primary context when the process first retains it (released when its last retain is),
 *   - each context made by cuCtxCreate (every ABI variant; released by cuCtxDestroy(_v2)),
 *
 * measured as the drop in the device's free memory across the driver call. "Before" comes from
 * cuMemGetInfo when the calling thread already has a context on that device (no NVML needed), else from
 * NVML's device free memory (cuMemGetInfo needs a context, which the call is about to make); "after" from
 * the same source. The two agree on the real driver. Other processes and other threads allocate at the
 * same moment, so the measured figure is bounded: at least the formula (what the context's limits hold:
 * stack of every resident thread x multiprocessors, malloc heap, printf FIFO), at most the formula plus
 * DL_CTX_SLACK (1 GiB, twice the largest context overhead seen). When nothing can be measured (no NVML,
 * no other context on the device), the charge is the largest of the formula and the last context measured
 * on that device by this process. All is rounded to the allocation granularity.
 *
 * cuCtxSetLimit's growth is charged before the driver call (over the limit: CUDA_ERROR_OUT_OF_MEMORY, and
 * the driver is not called), settled on what the driver then reports; what the context holds beyond its
 * limits is kept.
 *
 * A context the claim cannot afford is given back at once and the call answers CUDA_ERROR_OUT_OF_MEMORY.
 * No lock is held across a driver call: the primary contexts' retain counts are atomics, charges are kept
 * in memory.c's table keyed by context. Before a context goes, the compute limiter drops the timing events
 * it keeps for it (a new context may get the same address).
 */
#define _GNU_SOURCE
#include <string.h>

#include "contexts.h"
#include "fork.h"
#include "common.h"
#include "devices.h"
#include "driver.h"
#include "init.h"
#include "ledger.h"
#include "log.h"
#include "measure.h"
#include "nvml.h"
#include "region.h"

static struct {
    _Atomic int refs; /* this process's retains of the device's primary context */
    _Atomic(CUcontext) ctx;
} primary[DL_MAX_DEVICES];

/* The last context measured on each device by this process (bytes; 0: none yet). */
static _Atomic uint64_t measured[DL_MAX_DEVICES];

static void dl_contexts_reset_after_fork(void) { memset(primary, 0, sizeof primary); }
DL_FORK_HANDLERS(DL_FORK_CONTEXTS, NULL, NULL, dl_contexts_reset_after_fork);

#define REAL_OR_NOT_FOUND(name)                                                                                        \
    dl_cuda_init();                                                                                                    \
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

/* The device's free memory around a context's creation. */
struct probe {
    enum { PROBE_NONE, PROBE_CONTEXT, PROBE_NVML } how;
    int nvml_open; /* nvmlInit_v2 succeeded: one nvmlShutdown owed */
    nvmlDevice_t nvml;
    uint64_t before;
};

/* Free memory by cuMemGetInfo, when the calling thread's current context is on this device. */
static int context_free(int ordinal, uint64_t *free_bytes) {
    CUdevice cur;
    size_t f = 0, t = 0;
    if (!dl_cuda.cuCtxGetDevice || dl_cuda.cuCtxGetDevice(&cur) != CUDA_SUCCESS || (int)cur != ordinal ||
        !dl_cuda.cuMemGetInfo_v2 || dl_cuda.cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS)
        return -1;
    *free_bytes = f;
    return 0;
}

static int nvml_free(nvmlDevice_t h, uint64_t *free_bytes) {
    nvmlMemory_t m;
    if (!dl_measure.nvmlDeviceGetMemoryInfo || dl_measure.nvmlDeviceGetMemoryInfo(h, &m) != NVML_SUCCESS) return -1;
    *free_bytes = m.free;
    return 0;
}

/* NVML's handle of a CUDA device, by its UUID (NVML names a MIG instance "MIG-"). */
static int nvml_device_of(int ordinal, nvmlDevice_t *h) {
    CUuuid u;
    char s[DL_UUID_LEN];
    if (!dl_cuda.cuDeviceGetUuid_v2 || dl_cuda.cuDeviceGetUuid_v2(&u, ordinal) != CUDA_SUCCESS) return -1;
    dl_uuid_format((const unsigned char *)u.bytes, s);
    if (dl_measure.nvmlDeviceGetHandleByUUID(s, h) == NVML_SUCCESS) return 0;
    memcpy(s, "MIG-", 4);
    return dl_measure.nvmlDeviceGetHandleByUUID(s, h) == NVML_SUCCESS ? 0 : -1;
}

/* Reads the device's free memory before a context is made on it (only for an accounted device). */
static void probe_begin(struct probe *p, int ordinal) {
    p->how = PROBE_NONE;
    p->nvml_open = 0;
    if (dl_device_for_ordinal(ordinal, NULL) < 0) return;
    if (context_free(ordinal, &p->before) == 0) {
        p->how = PROBE_CONTEXT;
        return;
    }
    dl_measure_nvml_init(); /* the driver's own NVML, never the library path's (nvml.c) */
    if (!dl_measure.nvmlInit_v2 || !dl_measure.nvmlShutdown || !dl_measure.nvmlDeviceGetHandleByUUID) return;
    if (dl_measure.nvmlInit_v2() != NVML_SUCCESS) return;
    p->nvml_open = 1;
    if (nvml_device_of(ordinal, &p->nvml) == 0 && nvml_free(p->nvml, &p->before) == 0) p->how = PROBE_NVML;
}

/* What the driver took since probe_begin (0 when it cannot tell); ends the probe. */
static uint64_t probe_end(struct probe *p, CUcontext ctx, int ordinal) {
    uint64_t after = 0;
    int ok = 0;
    if (p->how == PROBE_NVML) ok = nvml_free(p->nvml, &after) == 0;
    if (p->how == PROBE_CONTEXT) {
        /* The thread's context is still current (a retain changes nothing), or the new one is (a create):
         * either is on this device. */
        CUcontext popped;
        int pushed = 0;
        ok = context_free(ordinal, &after) == 0;
        if (!ok && ctx && dl_cuda.cuCtxPushCurrent_v2 && dl_cuda.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
            pushed = 1;
            ok = context_free(ordinal, &after) == 0;
        }
        if (pushed) dl_cuda.cuCtxPopCurrent_v2(&popped);
    }
    if (p->nvml_open) dl_measure.nvmlShutdown();
    p->nvml_open = 0;
    int how = p->how;
    p->how = PROBE_NONE;
    if (!ok || how == PROBE_NONE) return 0;
    return p->before > after ? p->before - after : 0;
}

/* What to charge for a new context: the driver's measured take, bounded by its limits' formula below and
 * the formula plus DL_CTX_SLACK above; unmeasured, the larger of the formula and the device's last
 * measured context. */
static uint64_t context_charge(CUcontext ctx, int ordinal, struct probe *p) {
    uint64_t took = probe_end(p, ctx, ordinal);
    uint64_t formula = context_bytes(ctx, ordinal);
    uint64_t most = formula > UINT64_MAX - DL_CTX_SLACK ? UINT64_MAX : formula + DL_CTX_SLACK;
    int known = ordinal >= 0 && ordinal < DL_MAX_DEVICES;
    if (!took) {
        uint64_t last = known ? atomic_load(&measured[ordinal]) : 0;
        took = last < most ? last : most;
    } else if (known) {
        atomic_store(&measured[ordinal], took);
    }
    uint64_t bytes = took < formula ? formula : took > most ? most : took;
    dl_debug("context on device %d: the driver took %llu bytes, its limits hold %llu; charging %llu", ordinal,
             (unsigned long long)took, (unsigned long long)formula, (unsigned long long)bytes);
    return bytes;
}

/* Charges a new context; CUDA_ERROR_OUT_OF_MEMORY when the claim cannot hold it. */
static CUresult charge_context(CUcontext ctx, int ordinal, struct probe *p) {
    struct dl_charge c;
    CUresult r = dl_charge(ordinal, context_charge(ctx, ordinal, p), &c);
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
    struct probe p = {.how = PROBE_NONE};
    int first = pctx && dev >= 0 && dev < DL_MAX_DEVICES && atomic_load(&primary[dev].refs) == 0;
    if (first) {
        dl_core_init();
        probe_begin(&p, dev);
    }
    CUresult r = dl_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r != CUDA_SUCCESS || !first || atomic_fetch_add(&primary[dev].refs, 1) != 0) {
        probe_end(&p, NULL, dev);
        return r;
    }
    atomic_store(&primary[dev].ctx, *pctx);
    if (charge_context(*pctx, dev, &p) == CUDA_SUCCESS) return r;
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
    while (refs > 0 && !atomic_compare_exchange_weak(&primary[dev].refs, &refs, refs - 1)) {}
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
static CUresult created(CUresult r, CUcontext *pctx, CUdevice dev, struct probe *p) {
    if (r != CUDA_SUCCESS || !pctx) {
        probe_end(p, NULL, dev);
        return r;
    }
    if (charge_context(*pctx, dev, p) == CUDA_SUCCESS) return r;
    if (dl_cuda.cuCtxDestroy_v2) dl_cuda.cuCtxDestroy_v2(*pctx);
    dl_info("refusing a context on device %d: its memory would exceed the claim's limit", dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

DL_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate);
    struct probe p;
    dl_core_init();
    probe_begin(&p, dev);
    CUresult r = dl_cuda.cuCtxCreate(pctx, flags, dev);
    return created(r, pctx, dev, &p);
}

DL_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v2);
    struct probe p;
    dl_core_init();
    probe_begin(&p, dev);
    CUresult r = dl_cuda.cuCtxCreate_v2(pctx, flags, dev);
    return created(r, pctx, dev, &p);
}

DL_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                                  CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v3);
    struct probe p;
    dl_core_init();
    probe_begin(&p, dev);
    CUresult r = dl_cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev);
    return created(r, pctx, dev, &p);
}

DL_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev) {
    REAL_OR_NOT_FOUND(cuCtxCreate_v4);
    struct probe p;
    dl_core_init();
    probe_begin(&p, dev);
    CUresult r = dl_cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev);
    return created(r, pctx, dev, &p);
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
    int which = limit == CU_LIMIT_STACK_SIZE         ? 0
                : limit == CU_LIMIT_MALLOC_HEAP_SIZE ? 1
                : limit == CU_LIMIT_PRINTF_FIFO_SIZE ? 2
                                                     : -1;
    CUcontext ctx = NULL;
    uint64_t lim[3];
    int ordinal = dl_current_ordinal();
    if (which < 0 || ordinal < 0 || !dl_cuda.cuCtxGetCurrent || dl_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx ||
        current_limits(lim) != 0)
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
    uint64_t beyond = 0; /* what the context holds beyond its limits (measured at its creation) */
    if (!dl_rec_take(DL_REC_CTX, (uint64_t)(uintptr_t)ctx, &dev, &held, &aux)) dev = c.dev;
    else if (held > before) beyond = held - before;
    uint64_t now = current_limits(lim) == 0 ? reserve_for(ordinal, lim) : after;
    now = now > UINT64_MAX - beyond ? UINT64_MAX : now + beyond;
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
