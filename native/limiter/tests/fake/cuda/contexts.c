/*
 * Contexts: each device's primary context (retained, released, reset) and created ones, the calling thread's
 * stack of current contexts, and the device memory a context holds - FAKE_CUDA_CTX_BYTES of its own (the real
 * driver's 549 MB by default) and what its limits (cuCtxSetLimit: stack, malloc heap, printf FIFO) need,
 * refused with CUDA_ERROR_OUT_OF_MEMORY when the device cannot hold it. cuCtxSynchronize waits for the device,
 * under the capture rules of capture.c.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdlib.h>
#include <string.h>

static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth; /* ctx_stack[ctx_depth - 1] is current */

CUcontext current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

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
