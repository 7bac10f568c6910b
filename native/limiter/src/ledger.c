/*
 * The ledger of device memory: what each live allocation of the process charged, and the charging itself.
 *
 * Every allocation is charged to the claim's region before the driver is called (so that concurrent processes
 * never overshoot) and refunded if the driver fails. A process-local table remembers what each live allocation
 * charged, so the matching free/release/destroy gives back exactly that; it is striped by hash so threads
 * allocating concurrently rarely share a lock. Other modules keep records of their own in it (dl_rec_put).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ledger.h"
#include "fork.h"
#include "common.h"
#include "devices.h"
#include "init.h"
#include "log.h"
#include "region.h"

/* ---- what each live allocation charged ---- */

#define STRIPES 16
#define SPINS_BEFORE_YIELD 64
#define SPINS_BEFORE_SLEEP 1024 /* then sleep: a yield lets no lower-priority holder run (SCHED_FIFO waiters) */
static struct stripe {
    _Atomic int locked; /* held for a hash probe (rarely a rehash): see stripe_lock */
    struct entry *tab;
    size_t cap, live, used; /* used counts live entries and tombstones */
} stripes[STRIPES];

static uint64_t mix(uint64_t k, unsigned kind) { return dl_hash64(k ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull); }

/* Every allocation and free takes a stripe's lock once, for a few dozen instructions, so a waiter spins
 * briefly before it yields. Taking it is one atomic exchange and dropping it a plain store (a mutex takes
 * two atomic operations and two calls); static storage needs no initialisation. */
static void stripe_lock(struct stripe *s) {
    for (unsigned n = 0; atomic_exchange_explicit(&s->locked, 1, memory_order_acquire); n++) {
        while (atomic_load_explicit(&s->locked, memory_order_relaxed)) {
            if (++n >= SPINS_BEFORE_SLEEP) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            } else if (n >= SPINS_BEFORE_YIELD) {
                sched_yield();
            }
        }
    }
}
static void stripe_unlock(struct stripe *s) { atomic_store_explicit(&s->locked, 0, memory_order_release); }

/* fork(): no stripe may be held by a thread the child will not have (its fork handlers below, fork.h). */
static void dl_ledger_before_fork(void) {
    for (int i = 0; i < STRIPES; i++) stripe_lock(&stripes[i]);
}
static void dl_ledger_after_fork_parent(void) {
    for (int i = STRIPES - 1; i >= 0; i--) stripe_unlock(&stripes[i]);
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
int dl_insert(const struct entry *e, struct entry *old) {
    uint64_t h = mix(e->key, e->kind);
    struct stripe *s = &stripes[h & (STRIPES - 1)];
    memset(old, 0, sizeof *old);
    stripe_lock(s);
    if ((s->used + 1) * 4 > s->cap * 3 && grow(s) != 0) {
        stripe_unlock(s);
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
    stripe_unlock(s);
    return 0;
}

/* Gives a charge back: to the claim's total, or for memory shared with other processes of the claim (K_PTR
 * and K_HANDLE entries keep the export table's entry + 1 in their handle field) by ending this hold on it. */
void dl_release_charge(int dev, uint64_t bytes, uint64_t shared) {
    if (shared) dl_region_leave(dev, (int)shared - 1, bytes);
    else dl_region_release(dev, bytes);
}

/* Remembers a charge; an entry left behind for the same key (a free we did not see) is refunded. */
void dl_track_shared(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t shared) {
    if (dev < 0 || bytes == 0) return;
    struct entry old,
        e = {.key = key, .bytes = bytes, .handle = shared, .refs = 1, .dev = (int16_t)dev, .kind = (uint8_t)kind};
    if (dl_insert(&e, &old) != 0) {
        dl_release_charge(dev, bytes, shared); /* cannot remember it: do not keep charging it either */
        return;
    }
    if (old.kind) dl_release_charge(old.dev, old.bytes, old.handle);
}
void dl_track(unsigned kind, uint64_t key, int dev, uint64_t bytes) { dl_track_shared(kind, key, dev, bytes, 0); }

/* Looks an entry up under its stripe's lock and applies op to it; op returns 1 to delete the entry. The
 * entry as it was is copied to *out; returns whether it was found. */
int dl_update(unsigned kind, uint64_t key, int (*op)(struct entry *), struct entry *out) {
    uint64_t h = mix(key, kind);
    struct stripe *s = &stripes[h & (STRIPES - 1)];
    stripe_lock(s);
    struct entry *e = s->cap ? slot_for(s, key, kind, h, 0) : NULL;
    if (e) {
        *out = *e;
        if (op(e)) {
            *e = (struct entry){.tomb = 1};
            s->live--;
        }
    }
    stripe_unlock(s);
    return e != NULL;
}

int dl_op_delete(struct entry *e) {
    (void)e;
    return 1;
}
int dl_op_ref(struct entry *e) {
    e->refs++;
    return 0;
}
int dl_op_unref(struct entry *e) { return --e->refs == 0; }

/* Records other modules keep in the same table (see ledger.h). */
void dl_rec_put(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t aux) {
    struct entry old,
        e = {.key = key, .bytes = bytes, .handle = aux, .refs = 1, .dev = (int16_t)dev, .kind = (uint8_t)kind};
    (void)dl_insert(&e, &old);
}

int dl_rec_take(unsigned kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *aux) {
    struct entry e;
    if (!dl_update(kind, key, dl_op_delete, &e)) return 0;
    if (dev) *dev = e.dev;
    if (bytes) *bytes = e.bytes;
    if (aux) *aux = e.handle;
    return 1;
}

/* Forgets a charge and reports it (*shared: see release); 0 bytes if the key is unknown. */
uint64_t dl_untrack(unsigned kind, uint64_t key, int *dev, uint64_t *shared) {
    struct entry e;
    if (!dl_update(kind, key, dl_op_delete, &e)) return 0;
    *dev = e.dev;
    *shared = e.handle;
    return e.bytes;
}

/* A reference to a charged handle; 0 if the handle is not one we charged. */
int dl_handle_ref(uint64_t handle) {
    struct entry e;
    return handle && dl_update(K_HANDLE, handle, dl_op_ref, &e);
}

/* Drops a reference to a charged handle. Returns the bytes to refund when it was the last one (the entry
 * is gone then; *shared as for release), else 0; *known says whether the handle is one we charged. */
uint64_t dl_handle_unref(uint64_t handle, int *dev, int *known, uint64_t *shared) {
    struct entry e;
    *known = handle && dl_update(K_HANDLE, handle, dl_op_unref, &e);
    if (!*known || e.refs != 1) return 0;
    *dev = e.dev;
    *shared = e.handle;
    return e.bytes;
}

/* Undoes handle_unref after the driver refused the call. */
void dl_handle_unref_undo(uint64_t handle, int known, int dev, uint64_t bytes, uint64_t shared) {
    if (bytes) dl_track_shared(K_HANDLE, handle, dev, bytes, shared);
    else if (known) dl_handle_ref(handle);
}

/* The parent's allocations are not the child's (CUDA contexts do not survive fork). */
static void dl_ledger_reset_after_fork(void) {
    for (int i = 0; i < STRIPES; i++) {
        free(stripes[i].tab);
        stripes[i].tab = NULL;
        stripes[i].cap = stripes[i].live = stripes[i].used = 0;
        atomic_store(&stripes[i].locked, 0); /* taken by dl_ledger_before_fork */
    }
}
DL_FORK_HANDLERS(DL_FORK_LEDGER, dl_ledger_before_fork, dl_ledger_after_fork_parent, dl_ledger_reset_after_fork);

/* ---- charging ---- */

static _Atomic(const struct dl_reclaimer *) reclaimer;

void dl_charge_reclaimer(const struct dl_reclaimer *r) { atomic_store_explicit(&reclaimer, r, memory_order_release); }

/* Charges bytes, rounded up to the device's allocation granularity, to a device; CUDA_ERROR_OUT_OF_MEMORY
 * over the limit (after giving back what pools and graphs of the process no longer hold). An unknown device
 * is not charged: the driver will answer the call with its own error. */
CUresult dl_charge(int ordinal, uint64_t bytes, struct dl_charge *c) {
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
    if (limit != DL_NO_LIMIT) {
        const struct dl_reclaimer *rc = atomic_load_explicit(&reclaimer, memory_order_acquire);
        if (rc && rc->active()) rc->reclaim(ordinal);
    }
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

void dl_refund(const struct dl_charge *c) {
    if (c->bytes) dl_region_release(c->dev, c->bytes);
}

void dl_settle(CUresult r, unsigned kind, uint64_t key, const struct dl_charge *c) {
    if (r == CUDA_SUCCESS) dl_track(kind, key, c->dev, c->bytes);
    else dl_refund(c);
}
