/*
 * Device-memory cap.
 *
 * Every allocation family is charged to the claim's region before the driver is called (so that
 * concurrent processes never overshoot) and refunded if the driver fails; over the limit the wrapper
 * returns CUDA_ERROR_OUT_OF_MEMORY and the driver is not called. A process-local table remembers what
 * each live allocation charged, so the matching free/release/destroy gives back exactly that; it is
 * striped by hash so threads allocating concurrently rarely share a lock.
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

#include "limiter.h"

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
#define current_ordinal dl_current_ordinal

/* The legacy and per-thread default streams, which cuda.h defines as small handle values. */
#define IS_DEFAULT_STREAM(s) ((uintptr_t)(s) <= 2u)

int dl_stream_ordinal(CUstream s, int ptsz) {
    if (IS_DEFAULT_STREAM(s)) return current_ordinal();
    /* Asked first, and only while a capture is open: a capturing stream is not asked about (limiter.h). */
    if (dl_captures_open() && dl_stream_capture_status(s, ptsz) != 0) return current_ordinal();
    PFN_cuStreamGetDevice_v12080 get = ptsz ? dl_cuda.cuStreamGetDevice_ptsz : dl_cuda.cuStreamGetDevice;
    CUdevice d;
    if (get && get(s, &d) == CUDA_SUCCESS) return (int)d;
    /* A driver older than 12.8: through the stream's context. */
    PFN_cuStreamGetCtx_v9020 get_ctx = ptsz ? dl_cuda.cuStreamGetCtx_ptsz : dl_cuda.cuStreamGetCtx;
    CUcontext ctx;
    if (get_ctx && dl_cuda.cuCtxPushCurrent_v2 && dl_cuda.cuCtxPopCurrent_v2 && get_ctx(s, &ctx) == CUDA_SUCCESS &&
        dl_cuda.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
        int o = current_ordinal();
        CUcontext popped;
        dl_cuda.cuCtxPopCurrent_v2(&popped);
        return o;
    }
    return current_ordinal();
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

/* ---- what each live allocation charged ---- */

/* K_MAP: a mapping made by cuMemMap, keyed by its address: bytes is its size, handle what it maps (0 when
 * the handle is not one we charged). */
enum kind { K_PTR = 1, K_HANDLE = 2, K_ARRAY = 3, K_MIPMAP = 4, K_MAP = 5 }; /* DL_REC_* follow */

struct entry {
    uint64_t key;  /* 0 = empty */
    uint64_t bytes;
    uint64_t handle; /* K_MAP: the handle mapped; K_PTR, K_HANDLE: the export entry + 1 (see release) */
    uint32_t refs; /* K_HANDLE: the driver's references to the allocation that we have seen */
    int16_t dev;
    uint8_t kind;
    uint8_t tomb;
};

#define STRIPES 16
static struct stripe {
    pthread_mutex_t mu;
    struct entry *tab;
    size_t cap, live, used; /* used counts live entries and tombstones */
} stripes[STRIPES];
static pthread_once_t stripes_once = PTHREAD_ONCE_INIT;

static uint64_t mix(uint64_t k, unsigned kind) { return dl_hash64(k ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull); }

static void stripe_before_fork(void) {
    for (int i = 0; i < STRIPES; i++) pthread_mutex_lock(&stripes[i].mu);
}
static void stripe_after_fork_parent(void) {
    for (int i = STRIPES - 1; i >= 0; i--) pthread_mutex_unlock(&stripes[i].mu);
}
static void stripe_after_fork_child(void) {
    for (int i = 0; i < STRIPES; i++) pthread_mutex_init(&stripes[i].mu, NULL);
}

static void stripes_init(void) {
    for (int i = 0; i < STRIPES; i++) pthread_mutex_init(&stripes[i].mu, NULL);
    pthread_atfork(stripe_before_fork, stripe_after_fork_parent, stripe_after_fork_child);
}

static struct entry *slot_for(struct stripe *s, uint64_t key, unsigned kind, uint64_t h, int for_insert) {
    size_t mask = s->cap - 1, i = (size_t)(h >> 4) & mask;
    struct entry *tomb = NULL;
    for (size_t n = 0; n < s->cap; n++, i = (i + 1) & mask) {
        struct entry *e = &s->tab[i];
        if (e->tomb) {
            if (!tomb) tomb = e;
            continue;
        }
        if (e->kind == 0) return for_insert ? (tomb ? tomb : e) : NULL; /* empty: the key is absent */
        if (e->key == key && e->kind == kind) return e;
    }
    return for_insert ? tomb : NULL;
}

static int grow(struct stripe *s) {
    /* Sized from the live entries only: a rehash also drops the tombstones alloc/free churn leaves. */
    size_t ncap = 256;
    while (ncap < (s->live + 1) * 4) ncap *= 2;
    struct entry *old = s->tab, *nt = calloc(ncap, sizeof *nt);
    if (!nt) return -1;
    size_t ocap = s->cap;
    s->tab = nt;
    s->cap = ncap;
    s->used = s->live;
    for (size_t i = 0; i < ocap; i++) {
        struct entry *e = &old[i];
        if (e->tomb || e->kind == 0) continue;
        *slot_for(s, e->key, e->kind, mix(e->key, e->kind), 1) = *e;
    }
    free(old);
    return 0;
}

/* Inserts e, replacing an entry of the same key and kind, which is copied to *old (old->kind 0 if there
 * was none); -1 if the table cannot grow. */
static int insert(const struct entry *e, struct entry *old) {
    pthread_once(&stripes_once, stripes_init);
    uint64_t h = mix(e->key, e->kind);
    struct stripe *s = &stripes[h & (STRIPES - 1)];
    memset(old, 0, sizeof *old);
    pthread_mutex_lock(&s->mu);
    if ((s->used + 1) * 4 > s->cap * 3 && grow(s) != 0) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    struct entry *slot = slot_for(s, e->key, e->kind, h, 1);
    if (slot->key == e->key && slot->kind == e->kind && !slot->tomb) {
        *old = *slot;
    } else {
        if (!slot->tomb) s->used++;
        s->live++;
    }
    *slot = *e;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Gives a charge back: to the claim's total, or for memory shared with other processes of the claim (K_PTR
 * and K_HANDLE entries keep the export table's entry + 1 in their handle field) by ending this hold on it. */
static void release(int dev, uint64_t bytes, uint64_t shared) {
    if (shared) dl_region_leave(dev, (int)shared - 1, bytes);
    else dl_region_release(dev, bytes);
}

/* Remembers a charge; an entry left behind for the same key (a free we did not see) is refunded. */
static void track_shared(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t shared) {
    if (dev < 0 || bytes == 0) return;
    struct entry old, e = {.key = key, .bytes = bytes, .handle = shared, .refs = 1, .dev = (int16_t)dev,
                           .kind = (uint8_t)kind};
    if (insert(&e, &old) != 0) {
        release(dev, bytes, shared);  /* cannot remember it: do not keep charging it either */
        return;
    }
    if (old.kind) release(old.dev, old.bytes, old.handle);
}
static void track(unsigned kind, uint64_t key, int dev, uint64_t bytes) { track_shared(kind, key, dev, bytes, 0); }

/* Looks an entry up under its stripe's lock and applies op to it; op returns 1 to delete the entry. The
 * entry as it was is copied to *out; returns whether it was found. */
static int update(unsigned kind, uint64_t key, int (*op)(struct entry *), struct entry *out) {
    pthread_once(&stripes_once, stripes_init);
    uint64_t h = mix(key, kind);
    struct stripe *s = &stripes[h & (STRIPES - 1)];
    pthread_mutex_lock(&s->mu);
    struct entry *e = s->cap ? slot_for(s, key, kind, h, 0) : NULL;
    if (e) {
        *out = *e;
        if (op(e)) {
            *e = (struct entry){.tomb = 1};
            s->live--;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return e != NULL;
}

static int op_delete(struct entry *e) { (void)e; return 1; }
static int op_ref(struct entry *e) { e->refs++; return 0; }
static int op_unref(struct entry *e) { return --e->refs == 0; }

/* Records other modules keep in the same table (see limiter.h). */
void dl_rec_put(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t aux) {
    struct entry old, e = {.key = key, .bytes = bytes, .handle = aux, .refs = 1, .dev = (int16_t)dev, .kind = (uint8_t)kind};
    (void)insert(&e, &old);
}

int dl_rec_take(unsigned kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *aux) {
    struct entry e;
    if (!update(kind, key, op_delete, &e)) return 0;
    if (dev) *dev = e.dev;
    if (bytes) *bytes = e.bytes;
    if (aux) *aux = e.handle;
    return 1;
}

/* Forgets a charge and reports it (*shared: see release); 0 bytes if the key is unknown. */
static uint64_t untrack(unsigned kind, uint64_t key, int *dev, uint64_t *shared) {
    struct entry e;
    if (!update(kind, key, op_delete, &e)) return 0;
    *dev = e.dev;
    *shared = e.handle;
    return e.bytes;
}

/* A reference to a charged handle; 0 if the handle is not one we charged. */
static int handle_ref(uint64_t handle) {
    struct entry e;
    return handle && update(K_HANDLE, handle, op_ref, &e);
}

/* Drops a reference to a charged handle. Returns the bytes to refund when it was the last one (the entry
 * is gone then; *shared as for release), else 0; *known says whether the handle is one we charged. */
static uint64_t handle_unref(uint64_t handle, int *dev, int *known, uint64_t *shared) {
    struct entry e;
    *known = handle && update(K_HANDLE, handle, op_unref, &e);
    if (!*known || e.refs != 1) return 0;
    *dev = e.dev;
    *shared = e.handle;
    return e.bytes;
}

/* Undoes handle_unref after the driver refused the call. */
static void handle_unref_undo(uint64_t handle, int known, int dev, uint64_t bytes, uint64_t shared) {
    if (bytes) track_shared(K_HANDLE, handle, dev, bytes, shared);
    else if (known) handle_ref(handle);
}

void dl_memory_reset_after_fork(void) {
    dl_pools_reset_after_fork();
    dl_contexts_reset_after_fork();
    /* The parent's allocations are not the child's (CUDA contexts do not survive fork). */
    for (int i = 0; i < STRIPES; i++) {
        free(stripes[i].tab);
        stripes[i].tab = NULL;
        stripes[i].cap = stripes[i].live = stripes[i].used = 0;
    }
    for (int i = 0; i < DL_MAX_DEVICES; i++) atomic_store(&dev_index[i], 0);
}

/* ---- charging ---- */

struct charge {
    int dev;
    uint64_t bytes;
};

/* Charges bytes, rounded up to the device's allocation granularity, to a device; CUDA_ERROR_OUT_OF_MEMORY
 * over the limit (after giving back what pools and graphs of the process no longer hold). An unknown device
 * is not charged: the driver will answer the call with its own error. */
static CUresult charge(int ordinal, uint64_t bytes, struct charge *c) {
    c->dev = -1;
    c->bytes = 0;
    dl_core_init();
    uint64_t limit;
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0) return CUDA_SUCCESS;
    if (bytes == 0) return CUDA_SUCCESS; /* nothing new is held (a pool's spare memory, a context without limits) */
    bytes = dl_round_granule(ordinal, bytes);
    /* Pools or graphs of this process may have given memory back since they were last read: settle them
     * before the charge is admitted or refused (the refusal counter the node agent reads counts only real
     * refusals). A few attribute reads, and only in processes that use pools or graph memory. */
    if (limit != DL_NO_LIMIT && dl_pools_active()) dl_pools_reclaim(ordinal);
    int r = dl_region_reserve(dev, bytes, limit);
    if (r < 0) {
        dl_info("refusing %llu bytes on device %d: the claim would exceed its limit of %llu bytes",
                (unsigned long long)bytes, ordinal, (unsigned long long)limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == 0) {
        c->dev = dev;
        c->bytes = bytes;
    }
    return CUDA_SUCCESS;
}

static void refund(const struct charge *c) {
    if (c->bytes) dl_region_release(c->dev, c->bytes);
}

_Static_assert(sizeof(struct charge) == sizeof(struct dl_charge), "one charge record");
CUresult dl_charge(int ordinal, uint64_t bytes, struct dl_charge *c) { return charge(ordinal, bytes, (struct charge *)c); }
void dl_refund(const struct dl_charge *c) { refund((const struct charge *)c); }

static void settle(CUresult r, unsigned kind, uint64_t key, const struct charge *c) {
    if (r == CUDA_SUCCESS) track(kind, key, c->dev, c->bytes);
    else refund(c);
}

#define REAL_OR_NOT_FOUND(name) \
    dl_cuda_init();             \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND

/* Frees: forget the charge before the driver call, so an address the driver hands out again at once
 * cannot meet our stale entry; restore it if the driver refuses. */
#define FREE_WRAPPER(kind, key, call)                      \
    int dev_ = -1;                                         \
    uint64_t shared_ = 0, bytes_ = (key) ? untrack(kind, key, &dev_, &shared_) : 0; \
    CUresult r_ = call;                                    \
    if (bytes_) {                                          \
        if (r_ == CUDA_SUCCESS) release(dev_, bytes_, shared_); \
        else track_shared(kind, key, dev_, bytes_, shared_); \
    }                                                      \
    return r_

/* The allocations that return a device pointer for `bytesize` bytes on the current device; the
 * arguments after the name are the driver call's. */
#define CHARGED_ALLOC(name, ...)                                           \
    REAL_OR_NOT_FOUND(name);                                               \
    if (!dptr || bytesize == 0) return dl_cuda.name(__VA_ARGS__);          \
    struct charge c;                                                       \
    CUresult r = charge(current_ordinal(), bytesize, &c);                  \
    if (r != CUDA_SUCCESS) return r;                                       \
    r = dl_cuda.name(__VA_ARGS__);                                         \
    settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);                   \
    return r

DL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CHARGED_ALLOC(cuMemAlloc_v2, dptr, bytesize);
}

DL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CHARGED_ALLOC(cuMemAllocManaged, dptr, bytesize, flags);
}

#define PITCH_ESTIMATE 512u

DL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    REAL_OR_NOT_FOUND(cuMemAllocPitch_v2);
    size_t row = (WidthInBytes + PITCH_ESTIMATE - 1) / PITCH_ESTIMATE * PITCH_ESTIMATE;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 || row < WidthInBytes ||
        row > SIZE_MAX / Height)
        return dl_cuda.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    struct charge c;
    CUresult r = charge(current_ordinal(), (uint64_t)row * Height, &c);
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
    settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);
    return r;
}

/* A free of a pointer with no charge of its own (a pool's or a graph's): what holds its memory is settled
 * after the driver call. */
#define POOL_FREE(call)                                    \
    struct dl_pool_free pf_;                               \
    dl_pools_before_free(dptr, &pf_);                      \
    CUresult r_ = call;                                    \
    dl_pools_after_free(&pf_, r_);                         \
    return r_

/* Frees: the common case (a charged pointer) first, without touching the pools. */
#define FREE_PTR(call)                                     \
    int dev_ = -1;                                         \
    uint64_t shared_ = 0, bytes_ = dptr ? untrack(K_PTR, dptr, &dev_, &shared_) : 0; \
    if (DL_LIKELY(bytes_)) {                               \
        CUresult r_ = call;                                \
        if (r_ == CUDA_SUCCESS) release(dev_, bytes_, shared_); \
        else track_shared(K_PTR, dptr, dev_, bytes_, shared_); \
        return r_;                                         \
    }                                                      \
    POOL_FREE(call)

DL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuMemFree_v2);
    FREE_PTR(dl_cuda.cuMemFree_v2(dptr));
}

/* Stream-ordered allocations are charged by pools.c (to the device they land on, as the pool holds them);
 * the four entry points differ only in how they reach the driver. */
static CUresult ordered_call(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int variant) {
    switch (variant) {
        case 0: return dl_cuda.cuMemAllocAsync(dptr, bytes, s);
        case 1: return dl_cuda.cuMemAllocAsync_ptsz(dptr, bytes, s);
        case 2: return dl_cuda.cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
        default: return dl_cuda.cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, s);
    }
}

#define ORDERED_ALLOC(name, pool, variant)                                          \
    REAL_OR_NOT_FOUND(name);                                                        \
    if (!dptr || bytesize == 0) return ordered_call(dptr, bytesize, pool, hStream, variant); \
    return dl_ordered_alloc(dptr, bytesize, pool, hStream, variant, ordered_call)

DL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocAsync, NULL, 0);
}
DL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ORDERED_ALLOC(cuMemAllocAsync_ptsz, NULL, 1);
}
DL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream) {
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
    struct charge c;
    CUresult r = charge(prop->location.id, size, &c);
    if (r != CUDA_SUCCESS) return r;
    r = dl_cuda.cuMemCreate(handle, size, prop, flags);
    settle(r, K_HANDLE, r == CUDA_SUCCESS ? *handle : 0, &c);
    return r;
}

/* Releases and unmaps drop their references before the driver call (as frees forget theirs), so that a
 * handle value the driver hands out again at once cannot meet our stale entry; undone if it refuses. */
DL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_NOT_FOUND(cuMemRelease);
    int dev = -1, known;
    uint64_t shared = 0, bytes = handle_unref(handle, &dev, &known, &shared);
    CUresult r = dl_cuda.cuMemRelease(handle);
    if (r != CUDA_SUCCESS) handle_unref_undo(handle, known, dev, bytes, shared);
    else if (bytes) release(dev, bytes, shared);
    if (r == CUDA_SUCCESS && !known) dl_rec_take(DL_REC_IMPORT, handle, NULL, NULL, NULL); /* never mapped */
    return r;
}

/* ---- memory shared with other processes of the claim: charged once (region.c, the export table) ---- */

static int op_keep(struct entry *e) { (void)e; return 0; }

/* Moves the charge of an allocation this process exports into the claim's export table; whether the entry
 * took it (exported again: an IPC handle is the same, a descriptor is added to the entry). */
static bool export_charge(unsigned kind, uint64_t key, const struct dl_export_key *k) {
    struct entry e, old;
    if (!update(kind, key, op_keep, &e) || !e.bytes) return false;
    if (e.handle) return k->kind == DL_EXPORT_FD && dl_region_export_again(e.dev, (int)e.handle - 1, k->fd) == 0;
    int idx = dl_region_export(e.dev, k, e.bytes);
    if (idx < 0) return false;
    /* A free racing the export (the application's own bug) found the entry gone and refunded nothing: the
     * entry goes again at once, and this process's own count keeps the bytes until it exits. */
    if (!update(kind, key, op_delete, &e)) {
        dl_region_leave(e.dev, idx, 0);
        return true;
    }
    e.handle = (uint64_t)idx + 1;
    if (insert(&e, &old) != 0) release(e.dev, e.bytes, e.handle);
    return true;
}

/* Joins the entry of memory another process of the claim exported; its bytes are held by this process
 * alone (counted against the limit in its own memory). -1 when it is not such memory. */
static int join_export(int ordinal, const struct dl_export_key *k, uint64_t *bytes, int *dev) {
    uint64_t limit;
    dl_core_init();
    *dev = dl_device_for_ordinal(ordinal, &limit);
    return *dev < 0 ? -1 : dl_region_join(*dev, k, bytes, limit);
}

/* An imported allocation (another process's, through a shareable handle) is charged to the importer's claim
 * when it first maps it (the driver tells no size before): a handle of this process's own allocation is
 * already charged, and importing it only takes a reference, as the driver counts it. */
DL_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
    REAL_OR_NOT_FOUND(cuMemImportFromShareableHandle);
    CUresult r = dl_cuda.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS || !handle || handle_ref(*handle)) return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if (!dl_cuda.cuMemGetAllocationPropertiesFromHandle ||
        dl_cuda.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) != CUDA_SUCCESS) {
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; /* cannot tell: charge it where it is mapped from */
        prop.location.id = current_ordinal();
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return r;
    if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        /* Exported by a process of this claim: held from the import on, as the driver keeps it. */
        struct dl_export_key k;
        dl_export_key_fd(&k, (int)(intptr_t)osHandle);
        uint64_t bytes = 0;
        int dev, idx = join_export(prop.location.id, &k, &bytes, &dev);
        if (idx >= 0) {
            track_shared(K_HANDLE, *handle, dev, bytes, (uint64_t)idx + 1);
            return r;
        }
        /* Not proven to be one of the claim's exports (kcmp refused, another PID namespace), yet it may be:
         * the driver keeps it for this handle whatever the exporter releases, so it is charged now, as the
         * largest allocation the claim exports there - fail closed: the claim may pay twice, never not at
         * all. The driver tells no size before a mapping; memory of no export of the claim is charged then. */
        bytes = dev >= 0 ? dl_region_exported_most(dev) : 0;
        if (bytes) {
            struct charge c;
            if (charge(prop.location.id, bytes, &c) != CUDA_SUCCESS) {
                (void)dl_cuda.cuMemRelease(*handle);
                *handle = 0;
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            track(K_HANDLE, *handle, c.dev, c.bytes);
            return r;
        }
    }
    dl_rec_put(DL_REC_IMPORT, *handle, -1, 0, (uint64_t)(unsigned)prop.location.id);
    return r;
}

/* Legacy CUDA IPC: memory another process exported with cuIpcGetMemHandle, opened here, is charged to this
 * process's claim on the device it is opened on (the driver tells its size only once it is open: over the
 * limit it is closed again and refused), unless a process of the same claim exported it (then it is held,
 * not charged again). Opening a handle already open returns the same pointer with one more reference, as
 * the driver counts it; the last cuIpcCloseMemHandle refunds. The record's aux: the references in the low
 * 32 bits, the export entry + 1 above them. */
#define IPC_REFS(aux) ((aux) & 0xffffffffu)
#define IPC_SHARED(aux) ((aux) >> 32)
static CUresult ipc_opened(CUresult r, CUdeviceptr *pdptr, const CUipcMemHandle *handle) {
    if (r != CUDA_SUCCESS || !pdptr || !*pdptr) return r;
    int dev;
    uint64_t bytes, aux;
    if (dl_rec_take(DL_REC_IPC, *pdptr, &dev, &bytes, &aux)) {
        dl_rec_put(DL_REC_IPC, *pdptr, dev, bytes, aux + 1);
        return r;
    }
    size_t size = 0;
    int ordinal = -1;
    if (!dl_cuda.cuPointerGetAttribute ||
        dl_cuda.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, *pdptr) != CUDA_SUCCESS ||
        dl_cuda.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, *pdptr) != CUDA_SUCCESS ||
        size == 0) {
        ordinal = current_ordinal();
        size = 0;
    }
    struct charge c;
    if (size == 0) {
        /* Cannot tell what it holds: err on the side of the limit. */
        uint64_t limit = DL_NO_LIMIT;
        dl_core_init();
        if (ordinal >= 0 && dl_device_for_ordinal(ordinal, &limit) >= 0 && limit != DL_NO_LIMIT) {
            dl_error("cannot tell the size of CUDA IPC memory opened at %#llx; refusing it",
                     (unsigned long long)*pdptr);
            (void)dl_cuda.cuIpcCloseMemHandle(*pdptr);
            *pdptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        return r;
    }
    struct dl_export_key k;
    memset(&k, 0, sizeof k);
    k.kind = DL_EXPORT_IPC;
    memcpy(k.key, handle->reserved, sizeof k.key);
    uint64_t held = dl_round_granule(ordinal, size);
    int idx = join_export(ordinal, &k, &held, &dev);
    if (idx >= 0) {
        dl_rec_put(DL_REC_IPC, *pdptr, dev, held, 1 | ((uint64_t)idx + 1) << 32);
        return r;
    }
    if (charge(ordinal, size, &c) != CUDA_SUCCESS) {
        (void)dl_cuda.cuIpcCloseMemHandle(*pdptr);
        *pdptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dl_rec_put(DL_REC_IPC, *pdptr, c.dev, c.bytes, 1);
    return r;
}

DL_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    REAL_OR_NOT_FOUND(cuIpcOpenMemHandle);
    if (!dl_cuda.cuIpcCloseMemHandle) return CUDA_ERROR_NOT_FOUND;
    return ipc_opened(dl_cuda.cuIpcOpenMemHandle(pdptr, handle, Flags), pdptr, &handle);
}
DL_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    REAL_OR_NOT_FOUND(cuIpcOpenMemHandle_v2);
    if (!dl_cuda.cuIpcCloseMemHandle) return CUDA_ERROR_NOT_FOUND;
    return ipc_opened(dl_cuda.cuIpcOpenMemHandle_v2(pdptr, handle, Flags), pdptr, &handle);
}

DL_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuIpcCloseMemHandle);
    int dev = -1;
    uint64_t bytes = 0, aux = 0;
    int known = dptr && dl_rec_take(DL_REC_IPC, dptr, &dev, &bytes, &aux);
    CUresult r = dl_cuda.cuIpcCloseMemHandle(dptr);
    if (!known) return r;
    if (r != CUDA_SUCCESS) dl_rec_put(DL_REC_IPC, dptr, dev, bytes, aux);
    else if (IPC_REFS(aux) > 1) dl_rec_put(DL_REC_IPC, dptr, dev, bytes, aux - 1);
    else if (bytes) release(dev, bytes, IPC_SHARED(aux));
    return r;
}

DL_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuIpcGetMemHandle);
    CUresult r = dl_cuda.cuIpcGetMemHandle(pHandle, dptr);
    if (r == CUDA_SUCCESS && pHandle && dptr) {
        struct dl_export_key k;
        memset(&k, 0, sizeof k);
        k.kind = DL_EXPORT_IPC;
        memcpy(k.key, pHandle->reserved, sizeof k.key);
        (void)export_charge(K_PTR, dptr, &k);
    }
    return r;
}

DL_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuMemExportToShareableHandle);
    CUresult r = dl_cuda.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
    if (r != CUDA_SUCCESS || !shareableHandle || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return r;
    /* Our own descriptor of the same open file description, for importers to be compared with (kcmp): the
     * application's may be closed as soon as it is sent. Kept while this process holds the memory. */
    int kept = fcntl(*(int *)shareableHandle, F_DUPFD_CLOEXEC, 0);
    if (kept < 0) return r;
    struct dl_export_key k;
    dl_export_key_fd(&k, kept);
    if (!export_charge(K_HANDLE, handle, &k)) close(kept);
    return r;
}

DL_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    REAL_OR_NOT_FOUND(cuMemRetainAllocationHandle);
    CUresult r = dl_cuda.cuMemRetainAllocationHandle(handle, addr);
    /* The driver returns the very handle value that was mapped there. */
    if (r == CUDA_SUCCESS && handle) handle_ref(*handle);
    return r;
}

DL_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuMemMap);
    /* The first mapping of an imported allocation charges it (refused over the limit). */
    uint64_t imported_ordinal;
    struct charge ic = {.dev = -1, .bytes = 0};
    int imported = handle && size && dl_rec_take(DL_REC_IMPORT, handle, NULL, NULL, &imported_ordinal);
    if (imported) {
        CUresult a = charge((int)imported_ordinal, size, &ic);
        if (a != CUDA_SUCCESS) {
            dl_rec_put(DL_REC_IMPORT, handle, -1, 0, imported_ordinal);
            return a;
        }
    }
    CUresult r = dl_cuda.cuMemMap(ptr, size, offset, handle, flags);
    if (imported) {
        if (r != CUDA_SUCCESS) {
            refund(&ic);
            dl_rec_put(DL_REC_IMPORT, handle, -1, 0, imported_ordinal);
        } else {
            track(K_HANDLE, handle, ic.dev, ic.bytes); /* the import's own reference */
        }
    }
    if (r != CUDA_SUCCESS || !ptr || size == 0) return r;
    /* Mappings of handles we did not charge are remembered too (handle 0), so that an unmap spanning
     * several mappings can walk them all. */
    struct entry old, e = {.key = ptr, .bytes = size, .handle = handle_ref(handle) ? handle : 0, .kind = K_MAP};
    /* Not remembered (no memory): this mapping's reference goes; replaced: the driver mapped over an old
     * one, which is therefore gone (an unmap we did not see), and so is its reference. */
    uint64_t drop = insert(&e, &old) != 0 ? e.handle : old.kind ? old.handle : 0;
    int dev = -1, known;
    uint64_t shared = 0, bytes = handle_unref(drop, &dev, &known, &shared);
    if (bytes) release(dev, bytes, shared);
    return r;
}

/* What cuMemUnmap took apart before the driver call, to put back if the driver refuses. */
struct unmapped {
    struct entry map;
    int known, dev;
    uint64_t bytes; /* refund due: the mapping held the handle's last reference */
    uint64_t shared;
};

DL_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REAL_OR_NOT_FOUND(cuMemUnmap);
    /* The range covers whole mappings, back to back (the driver refuses anything else): walk them. */
    struct unmapped *list = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t va = ptr; ptr && va - ptr < size;) {
        struct entry m;
        if (!update(K_MAP, va, op_delete, &m)) break;
        if (n == cap) {
            struct unmapped *grown = realloc(list, (cap = cap ? cap * 2 : 8) * sizeof *list);
            if (!grown) {
                struct entry old;
                (void)insert(&m, &old);
                break;
            }
            list = grown;
        }
        struct unmapped *u = &list[n++];
        u->map = m;
        u->dev = -1;
        u->shared = 0;
        u->bytes = handle_unref(m.handle, &u->dev, &u->known, &u->shared);
        va += m.bytes;
    }
    CUresult r = dl_cuda.cuMemUnmap(ptr, size);
    /* Backwards when undoing: a handle mapped twice in the range comes back before it is referenced. */
    for (size_t k = 0; k < n; k++) {
        struct unmapped *u = &list[r == CUDA_SUCCESS ? k : n - 1 - k];
        if (r == CUDA_SUCCESS) {
            if (u->bytes) release(u->dev, u->bytes, u->shared);
        } else {
            struct entry old;
            handle_unref_undo(u->map.handle, u->known, u->dev, u->bytes, u->shared);
            (void)insert(&u->map, &old);
        }
    }
    free(list);
    return r;
}

/* Bytes per element of an array format (channels included where the format fixes them); block
 * compressed formats are rounded up to a byte per texel, and unknown formats count 16. */
static uint64_t format_bytes(CUarray_format f, unsigned channels) {
    uint64_t ch = channels ? channels : 1;
    switch (f) {
        case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return ch;
        case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF:
            return 2 * ch;
        case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT:
            return 4 * ch;
        case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: return 1;
        case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: return 2;
        case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: return 4;
        case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: return 2;
        case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: return 4;
        case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: return 8;
        default: return 16;
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
#define CHARGED_OBJECT(kind, bytes, call)                                         \
    struct charge c;                                                              \
    CUresult r = charge(current_ordinal(), (bytes), &c);                          \
    if (r != CUDA_SUCCESS) return r;                                              \
    r = call;                                                                     \
    settle(r, kind, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, &c);   \
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

DL_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    REAL_OR_NOT_FOUND(cuMemGetInfo_v2);
    CUresult r = dl_cuda.cuMemGetInfo_v2(free_bytes, total);
    if (r != CUDA_SUCCESS || (!free_bytes && !total)) return r;
    dl_core_init();
    uint64_t limit;
    int ordinal = current_ordinal();
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0 || limit == DL_NO_LIMIT) return r;
    dl_pools_reclaim(ordinal); /* the free view counts what pools still hold, no more */
    uint64_t t, f;
    dl_capped_view(dev, limit, total ? *total : UINT64_MAX, free_bytes ? *free_bytes : UINT64_MAX, &t, &f);
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
    struct charge c;
    CUresult r = charge(current_ordinal(), row * Height, &c);
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
    settle(r, K_PTR, r == CUDA_SUCCESS ? *dptr : 0, &c);
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
    dl_core_init();
    uint64_t limit;
    int ordinal = current_ordinal();
    int dev = dl_device_for_ordinal(ordinal, &limit);
    if (dev < 0 || limit == DL_NO_LIMIT) return r;
    dl_pools_reclaim(ordinal);
    uint64_t t, f;
    dl_capped_view(dev, limit, total ? *total : UINT64_MAX, free_bytes ? *free_bytes : UINT64_MAX, &t, &f);
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
