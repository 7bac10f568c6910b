/*
 * The claim's accounting region: one file, "dragpu-limiter.region", in the claim's state directory,
 * mapped MAP_SHARED by every limited process of every pod of the claim.
 *
 *   header   magic, layout version, sizes, and a device table keyed by GPU UUID (so pods that number
 *            their devices differently still meet on the same entry): claim-wide bytes in use and the
 *            compute limiter's shared clock per device
 *   exports  memory that processes of the claim share (legacy CUDA IPC, VMM descriptors): each entry
 *            holds the allocation's charge once, for every process of the claim that holds the memory
 *   slots    one per live process: the bytes it holds per device
 *
 * Liveness never rests on process ids (pods have separate PID namespaces): a process owns its slot by
 * holding an open-file-description (OFD) write lock on byte 1 + slot of the file. The kernel drops the
 * lock when the process dies, however it dies (SIGKILL included); the next process that locks the slot
 * (to claim it, or in a sweep before refusing an allocation) returns the dead owner's bytes to the
 * device totals - once the owner is gone by PID and start time too, which a process can tell only in its own
 * PID namespace; the node agent, which sees every process, marks the slots of others SLOT_GONE. Creation and
 * the device table are serialised by an OFD lock on byte 0.
 *
 * Counters are lock-free atomics in the shared mapping: admission is a compare-and-swap on the device
 * total against the limit, so concurrent allocations of several processes never overshoot the limit.
 * Updates go total-then-slot on charge and slot-then-total on release: a process killed between the two
 * steps leaves the total too high (the claim loses at most that one allocation's bytes until every
 * process of the claim has exited), never too low.
 *
 * Regions: one per claim with a limits file (its state directory comes from the file, see limits.c),
 * plus the environment's (DRAGPU_LIMITER_STATE_DIR) for devices of no such claim. A device handle names
 * the region and the device entry in it (region * DL_MAX_DEVICES + entry), so the wrappers never care.
 *
 * Failing closed: a claim's region that cannot be used (missing or unwritable directory, a file of
 * another layout version still in use (one that no process uses any more is made again) or of an unknown
 * layout or size, all slots taken, its lock held past LOCK_WAIT_MS, a deleted or resized file,
 * impossible counter values) refuses every limited allocation on its devices - never "no limit". Only
 * the environment's region, outside any claim, falls back to per-process accounting with a warning, as
 * it always has. Besides the shared total, every process checks its own charges against the limit,
 * which no other process can change: rewriting the region never gets the rewriting process more.
 *
 * Locks: waits for byte 0 are bounded (LOCK_WAIT_MS); a process that holds it cannot hang the others.
 * OFD locks exclude open file descriptions, not processes, so each locking operation opens its own
 * description of the file (/proc/self/fd/N): the threads of one process then exclude each other as other
 * processes do, and no process-wide mutex is held while waiting for a file lock.
 *
 * Shared memory: an allocation a process exports (cuIpcGetMemHandle, cuMemExportToShareableHandle) moves
 * its charge from the exporter's slot into an entry of the export table, which the exporter holds (bit
 * <slot> of the entry's holders). A process of the same claim that opens or imports that memory joins the
 * entry instead of charging it again; the memory stays charged as long as any holder lives, as the driver
 * keeps it for as long as anyone has it open, and the last holder to let go (or the sweep that finds every
 * holder dead) gives it back. An import is matched to an entry only on proof that it is the same memory: the
 * 64-byte IPC handle, or for a VMM descriptor the kernel's word (kcmp) that the importer's descriptor is the
 * very open file description the exporter holds. Anything else (another claim's memory, a full table, no
 * kcmp) is charged to the importer as well: the claim then gets less than its limit, never more. Every
 * process still counts what it holds against the limit in its own memory. The table is changed only
 * under the byte-0 lock.
 *
 * When no state directory is given, or the environment's cannot be used, the same layout lives in
 * private anonymous memory: the limits then apply to this process alone.
 *
 * Why one file of more than 600 lines: the charges and the export table are one state under the byte-0 lock: the
 * sweep that gives a dead process's charges back also settles the export entries it held (sweep,
 * settle_descriptors), and both move the device totals every charge is admitted against. What shares none of that
 * state, the file's layout, locks and mapping, is region_file.c's already.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "region.h"
#include "claim_limits.h"
#include "clock.h"
#include "common.h"
#include "config.h"
#include "log.h"
#include "region_file.h"

/* This process's holds on each export entry (several opens or imports of one allocation set one bit), and
 * the descriptor it keeps for an entry it exported as a VMM descriptor (fd -1: none; closed only while it is
 * still the file it was, should the application have closed it under us). Changed under byte 0. */
static struct own_export {
    _Atomic int holds;
    int n_kept;
    struct kept {
        int fd;
        dev_t dev;
        ino_t ino;
    } kept[EXPORT_FDS];
} own_exports[MAX_REGIONS][REGION_EXPORTS];

/* Memory this process exported as descriptors and has released, while one of those descriptors is still open
 * here: the driver keeps an allocation for as long as a descriptor of it is open (the H100 record's
 * vmm.after_release_all), so its charge - this process's hold on the export entry - stays until they are all
 * closed, noticed on the slow paths (a sweep, a report of free memory). */
#define HELD_MAX 64
static struct held_by_fd {
    int dev, idx;
    uint64_t bytes;
    int n;
    dev_t fdev[EXPORT_FDS];
    ino_t ino[EXPORT_FDS];
} held_by_fd[HELD_MAX];
static int n_held_by_fd;
static _Atomic int any_held_by_fd;
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether a descriptor of any of these files is open in this process. */
static bool descriptor_open(const struct held_by_fd *h) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return false;
    bool open_ = false;
    struct dirent *e;
    while (!open_ && (e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0) continue;
        for (int i = 0; i < h->n; i++)
            if (st.st_dev == h->fdev[i] && st.st_ino == h->ino[i]) open_ = true;
    }
    closedir(d);
    return open_;
}

/* Keeps a descriptor for an entry this process exported: its index in the entry, or -1 when it is full. */
static int keep_fd(struct own_export *o, int fd) {
    struct stat st;
    if (o->n_kept == EXPORT_FDS || fstat(fd, &st) != 0) return -1;
    o->kept[o->n_kept] = (struct kept){fd, st.st_dev, st.st_ino};
    return o->n_kept++;
}

static void close_kept(struct own_export *o) {
    for (int i = 0; i < o->n_kept; i++) {
        struct kept *k = &o->kept[i];
        struct stat st;
        if (fstat(k->fd, &st) == 0 && st.st_dev == k->dev && st.st_ino == k->ino) close(k->fd);
    }
    o->n_kept = 0;
}

void dl_region_open(const char *dir) {
    struct region *g = &regions[0];
    snprintf(g->what, sizeof g->what, "the environment's state directory");
    if (dir && dir[0] && open_shared(g, dir, DL_LOG_WARN, false) == 0) {
        /* shared */
    } else {
        if (!dir || !dir[0]) dl_debug("DRAGPU_LIMITER_STATE_DIR is not set: limits apply to this process only");
        open_private(g, false);
    }
    for (int c = 0; c < dl_claims.n; c++) {
        struct region *r = &regions[1 + c];
        const struct dl_claim *cl = &dl_claims.claims[c];
        snprintf(r->what, sizeof r->what, "claim %.50s", cl->name);
        if (cl->broken || open_shared(r, cl->state_dir, DL_LOG_ERROR, true) != 0) open_private(r, true);
        else open_floor(r, cl->state_dir);
    }
    snprintf(regions[CLOSED_REGION].what, sizeof regions[CLOSED_REGION].what, "unaccounted devices");
    open_private(&regions[CLOSED_REGION], true);
}

bool dl_region_is_shared(void) { return regions[0].fd >= 0; }

void dl_region_reset_after_fork(void) {
    /* The child must not keep the parent's locks (they would keep the parent's slots alive) nor its
     * counters: it re-opens the regions and claims its own slots on its next limited call. */
    for (int i = 0; i < MAX_REGIONS; i++) {
        struct region *g = &regions[i];
        unmap(g); /* closing our descriptor keeps the parent's locks: the parent still holds the description */
        g->closed = false;
        atomic_store(&g->bad, 0);
        atomic_store(&g->verified_ns, 0);
    }
    pthread_mutex_init(&held_mu, NULL); /* another thread may have held it at fork() */
    n_held_by_fd = 0;                   /* the parent's holds, not the child's */
    atomic_store(&any_held_by_fd, 0);
    for (int i = 0; i < MAX_REGIONS * DL_MAX_DEVICES; i++) {
        atomic_store(&own_used[i], 0);
        atomic_store(&floor_seen[i], 0);
        atomic_store(&own_at_floor[i], 0);
    }
    self_pidns = self_start = 0;          /* the child is another process (and may be in a new PID namespace) */
    for (int r = 0; r < MAX_REGIONS; r++) /* the child holds nothing: it has no slot yet */
        for (int i = 0; i < REGION_EXPORTS; i++) {
            struct own_export *o = &own_exports[r][i];
            if (atomic_exchange(&o->holds, 0) > 0) close_kept(o);
        }
}

static int find_device(struct region *g, const char *uuid) {
    for (int i = 0; i < DL_MAX_DEVICES; i++) {
        struct region_dev *d = &hdr(g)->devs[i];
        if (atomic_load_explicit(&d->ready, memory_order_acquire) && strncmp(d->uuid, uuid, DL_UUID_LEN) == 0) return i;
    }
    return -1;
}

int dl_region_device(const char *uuid) {
    int r = 0;
    if (dl_limits_from_files()) {
        int c = dl_claim_device(&dl_claims, uuid, NULL);
        if (c >= 0) r = 1 + c;
        else if (dl_claims.closed_all || !dl_uuid_valid(uuid, strlen(uuid))) r = CLOSED_REGION;
    }
    struct region *g = &regions[r];
    if (g->closed) return r * DL_MAX_DEVICES;
    int idx = find_device(g, uuid);
    if (idx >= 0) {
        link_floor(g, idx, uuid);
        return r * DL_MAX_DEVICES + idx;
    }
    int fd = -1;
    if (g->fd >= 0) {
        fd = own_description(g);
        if (fd < 0 || lock_byte_bounded(fd, 0) != 0) {
            dl_error("cannot lock the device table of %s (%s): %s; refusing allocations on %s", g->path, g->what,
                     strerror(errno), uuid);
            if (fd >= 0) close(fd);
            return CLOSED_REGION * DL_MAX_DEVICES;
        }
    }
    idx = find_device(g, uuid);
    for (int i = 0; idx < 0 && i < DL_MAX_DEVICES; i++) {
        struct region_dev *d = &hdr(g)->devs[i];
        if (!atomic_load(&d->ready)) {
            snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
            atomic_store_explicit(&d->ready, 1, memory_order_release);
            idx = i;
        }
    }
    if (fd >= 0) close(fd); /* drops the lock */
    if (idx < 0) {
        dl_error("the device table of %s (%s) is full; refusing allocations on %s", g->path, g->what, uuid);
        return CLOSED_REGION * DL_MAX_DEVICES;
    }
    link_floor(g, idx, uuid);
    return r * DL_MAX_DEVICES + idx;
}

/* What a process that shares a region can break without the kernel's help: the file's name, size and
 * header, and impossible counters. Any of these closes the region for this process. */
static void verify(struct region *g) {
    if (g->fd < 0 || atomic_load(&g->bad)) return;
    atomic_store(&g->verified_ns, (int64_t)dl_now_ns());
    struct stat st;
    struct stat at;
    if (fstat(g->fd, &st) != 0 || st.st_nlink == 0) mark_bad(g, "was deleted");
    else if (stat(g->path, &at) != 0 || at.st_dev != st.st_dev || at.st_ino != st.st_ino)
        mark_bad(g, "was replaced by another file");
    else if (st.st_size != (off_t)REGION_BYTES) mark_bad(g, "was resized");
    else if (!header_matches(g)) mark_bad(g, "has a rewritten header");
    for (int d = 0; d < DL_MAX_DEVICES; d++) {
        int64_t v = atomic_load_explicit(&hdr(g)->devs[d].used, memory_order_relaxed);
        if (v < 0 || v > SANE_BYTES) mark_bad(g, "holds an impossible claim-wide count");
    }
    for (int i = 0; i < REGION_EXPORTS; i++) {
        const struct region_export *x = export_at(g, i);
        int64_t b = __atomic_load_n(&x->bytes, __ATOMIC_RELAXED);
        if (atomic_load_explicit(&x->live, memory_order_relaxed) &&
            (__atomic_load_n(&x->dev, __ATOMIC_RELAXED) >= DL_MAX_DEVICES || b < 0 || b > SANE_BYTES))
            mark_bad(g, "holds an impossible shared-memory entry");
    }
}

/* Returns the bytes of dead processes to the totals. Only ever takes non-blocking file locks. */
static void settle_descriptors(void);

static void sweep(struct region *g) {
    settle_descriptors();
    if (g->fd < 0) return;
    verify(g);
    int fd = own_description(g);
    if (fd < 0) return;
    /* With byte 0 (one try, never a wait), the holds of every slot without a live owner go too: no process
     * claims a slot or joins an entry meanwhile. Without it, the next sweep does it. */
    int table = lock_byte(fd, 0, F_WRLCK) == 0;
    uint64_t gone[HOLDER_WORDS] = {0};
    for (int i = 0; i < REGION_SLOTS; i++) {
        if (i == g->slot) continue;
        struct region_slot *s = slot_at(g, i);
        if (atomic_load(&s->in_use)) {
            if (lock_byte(fd, 1 + i, F_WRLCK) != 0) continue; /* owner alive */
            if (!owner_gone(s)) {                             /* its lock was dropped, its process was not */
                lock_byte(fd, 1 + i, F_UNLCK);
                continue;
            }
            reclaim(g, i);
            forget_owner(s);
            atomic_store(&s->in_use, 0);
            lock_byte(fd, 1 + i, F_UNLCK);
            dl_debug("returned the memory of an exited process (slot %d of %s)", i, g->path);
        }
        gone[i / 64] |= 1ull << (i % 64);
    }
    if (table) drop_holders(g, gone);
    close(fd); /* drops byte 0 */
}

int dl_region_reserve(int dev, uint64_t bytes, uint64_t limit) {
    struct region *g = region_of(dev);
    int e = entry_of(dev);
    if ((int64_t)bytes < 0 || bytes > (uint64_t)INT64_MAX / 4) return limit == DL_NO_LIMIT ? 1 : -1;
    if (g->closed || atomic_load_explicit(&g->bad, memory_order_relaxed)) return limit == DL_NO_LIMIT ? 1 : -1;
    /* Our own charges first: no rewrite of the shared counters gets this process past the limit. */
    _Atomic int64_t *own = &own_used[dev];
    int64_t mine = atomic_load_explicit(own, memory_order_relaxed);
    do {
        if (limit != DL_NO_LIMIT && (mine < 0 || bytes > limit || (uint64_t)mine > limit - bytes)) {
            atomic_fetch_add_explicit(&hdr(g)->stats[e].refused, 1, memory_order_relaxed);
            return -1;
        }
    } while (!atomic_compare_exchange_weak_explicit(own, &mine, mine + (int64_t)bytes, memory_order_relaxed,
                                                    memory_order_relaxed));
    /* The structural check, at most every VERIFY_EVERY_NS; the clock is read every 64th allocation. */
    static __thread __attribute__((tls_model("initial-exec"))) unsigned tick; /* per thread: no shared atomic */
    if (g->fd >= 0 && (tick++ & 63) == 0 &&
        (int64_t)dl_now_ns() - atomic_load_explicit(&g->verified_ns, memory_order_relaxed) > VERIFY_EVERY_NS)
        verify(g);
    struct region_dev *d = &hdr(g)->devs[e];
    bool waited = false;
    for (int attempt = 0; attempt < 2 && !atomic_load_explicit(&g->bad, memory_order_relaxed); attempt++) {
        int64_t cur = atomic_load_explicit(&d->used, memory_order_relaxed);
        int64_t seen;
        uint64_t seq;
        int64_t floor = floor_read(g, e, &seen, &seq);
        floor = floor_account(dev, floor, seq, mine);
        for (;;) {
            if (cur < 0 || cur > SANE_BYTES) {
                mark_bad(g, "holds an impossible claim-wide count");
                break;
            }
            uint64_t in_use = (uint64_t)(cur > floor ? cur : floor); /* never below what the driver says */
            if (limit != DL_NO_LIMIT && (bytes > limit || in_use > limit - bytes)) {
                /* Only the floor refuses, and the claim released memory since the agent's sample: decide on the
                 * next sample (an honest free-then-allocate is not refused on a stale floor). */
                if (!waited && limit != DL_NO_LIMIT && bytes <= limit && (uint64_t)cur <= limit - bytes && cur < seen) {
                    waited = true;
                    floor_wait(g, seq);
                    floor = floor_read(g, e, &seen, &seq);
                    floor = floor_account(dev, floor, seq, mine);
                    cur = atomic_load_explicit(&d->used, memory_order_relaxed);
                    continue;
                }
                break;
            }
            if (atomic_compare_exchange_weak(&d->used, &cur, cur + (int64_t)bytes)) {
                atomic_fetch_add_explicit(&slot_at(g, g->slot)->used[e], (int64_t)bytes, memory_order_relaxed);
                return 0;
            }
        }
        if (attempt == 0) sweep(g);
    }
    atomic_fetch_sub_explicit(own, (int64_t)bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&hdr(g)->stats[e].refused, 1, memory_order_relaxed);
    if (limit == DL_NO_LIMIT) return 1; /* a broken region never stops an unlimited device */
    return -1;
}

void dl_region_release(int dev, uint64_t bytes) {
    struct region *g = region_of(dev);
    int e = entry_of(dev);
    if (g->closed) return;
    atomic_fetch_sub_explicit(&own_used[dev], (int64_t)bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&slot_at(g, g->slot)->used[e], (int64_t)bytes, memory_order_relaxed);
    atomic_fetch_sub(&hdr(g)->devs[e].used, (int64_t)bytes);
}

uint64_t dl_region_used(int dev) {
    struct region *g = region_of(dev);
    if (g->closed) return UINT64_MAX;
    sweep(g);
    if (atomic_load(&g->bad)) return UINT64_MAX;
    int64_t v = atomic_load(&hdr(g)->devs[entry_of(dev)].used);
    int64_t mine = atomic_load(&own_used[dev]), seen;
    uint64_t seq;
    int64_t floor = floor_read(g, entry_of(dev), &seen, &seq);
    floor = floor_account(dev, floor, seq, mine);
    if (v < mine) v = mine;
    if (v < floor) v = floor;
    return v > 0 ? (uint64_t)v : 0;
}

_Atomic int64_t *dl_region_tat(int dev) { return &hdr(region_of(dev))->devs[entry_of(dev)].tat_ns; }

void dl_region_tat_reset(int dev, int64_t seen, int64_t now) {
    static _Atomic int warned;
    if (atomic_compare_exchange_strong(dl_region_tat(dev), &seen, now) && !atomic_exchange(&warned, 1))
        dl_error("the compute clock in %s (%s) was %lld s ahead, further than any claim's work can put it; "
                 "reset to now",
                 region_of(dev)->path, region_of(dev)->what, (long long)((seen - now) / 1000000000LL));
}

void dl_region_add_throttled(int dev, int64_t ns) {
    if (ns > 0)
        atomic_fetch_add_explicit(&hdr(region_of(dev))->stats[entry_of(dev)].throttled_ns, (uint64_t)ns,
                                  memory_order_relaxed);
}

void dl_region_add_busy(int dev, int64_t ns) {
    if (ns > 0)
        atomic_fetch_add_explicit(&hdr(region_of(dev))->stats[entry_of(dev)].busy_ns, (uint64_t)ns,
                                  memory_order_relaxed);
}

/* ---- shared memory: the export table (see the top) ---- */

/* Byte 0 on a description of our own, waiting at most LOCK_WAIT_MS: the descriptor, or -1. */
static int table_lock(const struct region *g) {
    int fd = own_description(g);
    if (fd >= 0 && lock_byte_bounded(fd, 0) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool can_share(const struct region *g) {
    return g->fd >= 0 && !g->closed && !atomic_load_explicit(&g->bad, memory_order_relaxed);
}

void dl_export_key_fd(struct dl_export_key *k, int fd) {
    memset(k, 0, sizeof *k);
    k->kind = DL_EXPORT_FD;
    k->fd = fd;
    k->pid = (int32_t)getpid();
    k->pidns = own_pidns();
}

int dl_region_export(int dev, const struct dl_export_key *k, uint64_t bytes) {
    struct region *g = region_of(dev);
    int r = dev / DL_MAX_DEVICES, e = entry_of(dev);
    if (!can_share(g) || bytes == 0 || bytes > (uint64_t)SANE_BYTES) return -1;
    int fd = table_lock(g);
    if (fd < 0) return -1;
    int idx = -1;
    for (int i = 0; i < REGION_EXPORTS && idx < 0; i++)
        if (!atomic_load(&export_at(g, i)->live)) idx = i;
    if (idx >= 0) {
        struct region_export *x = export_at(g, idx);
        __atomic_store_n(&x->dev, (uint32_t)e, __ATOMIC_RELAXED);
        x->kind = (uint32_t)k->kind;
        x->pid = k->pid;
        x->pidns = k->pidns;
        __atomic_store_n(&x->bytes, (int64_t)bytes, __ATOMIC_RELAXED); /* verify() reads it unlocked */
        struct own_export *o = &own_exports[r][idx];
        o->n_kept = 0;
        if (k->kind == DL_EXPORT_FD) {
            for (int i = 0; i < EXPORT_FDS; i++) x->id.fds[i] = -1;
            if (keep_fd(o, k->fd) == 0) x->id.fds[0] = k->fd;
        } else {
            memcpy(x->id.key, k->key, sizeof x->id.key);
        }
        for (int w = 0; w < HOLDER_WORDS; w++) atomic_store(&x->holders[w], 0);
        set_holder(x, g->slot);
        atomic_store(&o->holds, 1);
        /* Slot first, then the entry: a process killed in between leaves the total too high, never too low. */
        atomic_fetch_sub(&slot_at(g, g->slot)->used[e], (int64_t)bytes);
        atomic_store(&x->live, 1);
    }
    close(fd);
    static _Atomic int told;
    if (idx < 0 && !atomic_exchange(&told, 1))
        dl_info("the shared-memory table of %s (%s) is full: memory exported now is charged to every process "
                "of the claim that holds it",
                g->path, g->what);
    return idx;
}

/* Whether an entry is the memory k names (caller holds byte 0). */
static bool same_memory(const struct region_export *x, const struct dl_export_key *k) {
    if (x->kind != (uint32_t)k->kind) return false;
    if (k->kind == DL_EXPORT_IPC) return memcmp(x->id.key, k->key, sizeof x->id.key) == 0;
    /* The importer's descriptor must be the very open file description of one the exporter keeps: the kernel
     * compares them (refused without ptrace-read access to the exporter, or where seccomp forbids kcmp). */
    if (x->pidns == 0 || x->pidns != k->pidns) return false;
    for (int i = 0; i < EXPORT_FDS; i++)
        if (x->id.fds[i] >= 0 && syscall(SYS_kcmp, (pid_t)k->pid, (pid_t)x->pid, KCMP_FILE, (unsigned long)k->fd,
                                         (unsigned long)x->id.fds[i]) == 0)
            return true;
    return false;
}

uint64_t dl_region_exported_most(int dev) {
    struct region *g = region_of(dev);
    uint32_t e = (uint32_t)entry_of(dev);
    uint64_t most = 0;
    if (!can_share(g)) return 0;
    for (int i = 0; i < REGION_EXPORTS; i++) {
        struct region_export *x = export_at(g, i);
        int64_t b = __atomic_load_n(&x->bytes, __ATOMIC_RELAXED);
        if (atomic_load(&x->live) && __atomic_load_n(&x->dev, __ATOMIC_RELAXED) == e && x->kind == DL_EXPORT_FD &&
            b > 0 && (uint64_t)b > most)
            most = (uint64_t)b;
    }
    return most;
}

int dl_region_export_again(int dev, int idx, int fd) {
    struct region *g = region_of(dev);
    struct own_export *o = &own_exports[dev / DL_MAX_DEVICES][idx];
    if (!can_share(g) || idx < 0 || idx >= REGION_EXPORTS) return -1;
    int lock = table_lock(g);
    if (lock < 0) return -1;
    struct region_export *x = export_at(g, idx);
    int i = atomic_load(&o->holds) > 0 && atomic_load(&x->live) && x->kind == DL_EXPORT_FD ? keep_fd(o, fd) : -1;
    if (i >= 0) x->id.fds[i] = fd;
    close(lock);
    return i < 0 ? -1 : 0;
}

int dl_region_join(int dev, const struct dl_export_key *k, uint64_t *bytes, uint64_t limit) {
    struct region *g = region_of(dev);
    int r = dev / DL_MAX_DEVICES, e = entry_of(dev);
    if (!can_share(g)) return -1;
    int fd = table_lock(g);
    if (fd < 0) return -1;
    int idx = -1;
    for (int i = 0; i < REGION_EXPORTS && idx < 0; i++) {
        struct region_export *x = export_at(g, i);
        if (atomic_load(&x->live) && x->dev == (uint32_t)e && x->bytes > 0 &&
            (*bytes == 0 || (uint64_t)x->bytes == *bytes) && same_memory(x, k))
            idx = i;
    }
    if (idx >= 0) {
        /* What this process holds still counts against the limit in its own memory. */
        struct region_export *x = export_at(g, idx);
        struct own_export *o = &own_exports[r][idx];
        int64_t b = x->bytes, mine = atomic_load(&own_used[dev]);
        if (atomic_load(&o->holds) == 0 && limit != DL_NO_LIMIT &&
            (mine < 0 || (uint64_t)b > limit || (uint64_t)mine > limit - (uint64_t)b)) {
            idx = -1;
        } else {
            if (atomic_load(&o->holds) == 0) o->n_kept = 0; /* keeps no descriptor: it did not export it */
            /* One allocation, counted once in this process however many of its handles (the driver returns a
             * new one per import, its own export's included) hold it. */
            if (atomic_fetch_add(&o->holds, 1) == 0) {
                atomic_fetch_add(&own_used[dev], b);
                set_holder(x, g->slot);
            }
            *bytes = (uint64_t)b;
        }
    }
    close(fd);
    return idx;
}

static void leave_entry(struct region *g, int idx, int fd) {
    struct region_export *x = export_at(g, idx);
    atomic_fetch_and(&x->holders[g->slot / 64], ~(1ull << (g->slot % 64)));
    uint64_t left = 0;
    for (int w = 0; w < HOLDER_WORDS; w++) left |= atomic_load(&x->holders[w]);
    if (fd >= 0 && !left && atomic_load(&x->live)) retire(g, x);
}

/* Gives back the holds of released exports whose descriptors this process has all closed since. */
static void settle_descriptors(void) {
    if (!atomic_load_explicit(&any_held_by_fd, memory_order_relaxed)) return;
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < n_held_by_fd;) {
        struct held_by_fd *h = &held_by_fd[i];
        if (descriptor_open(h)) {
            i++;
            continue;
        }
        struct region *g = region_of(h->dev);
        atomic_fetch_sub(&own_used[h->dev], (int64_t)h->bytes);
        if (g->fd >= 0 && !g->closed) {
            int fd = table_lock(g);
            leave_entry(g, h->idx, fd);
            if (fd >= 0) close(fd);
        }
        *h = held_by_fd[--n_held_by_fd];
    }
    atomic_store(&any_held_by_fd, n_held_by_fd > 0);
    pthread_mutex_unlock(&held_mu);
}

void dl_region_leave(int dev, int idx, uint64_t bytes) {
    struct region *g = region_of(dev);
    int r = dev / DL_MAX_DEVICES;
    if (g->closed || idx < 0 || idx >= REGION_EXPORTS) return;
    struct own_export *o = &own_exports[r][idx];
    int held = atomic_load(&o->holds);
    while (held > 0 && !atomic_compare_exchange_weak(&o->holds, &held, held - 1)) {}
    if (held == 1) atomic_fetch_sub(&own_used[dev], (int64_t)bytes); /* counted once (dl_region_join) */
    if (g->fd < 0) return;
    int fd = table_lock(g); /* not taken: the hold still goes; a later sweep retires the entry */
    struct region_export *x = export_at(g, idx);
    if (held == 1) {
        struct held_by_fd kept = {.dev = dev, .idx = idx, .bytes = bytes};
        for (int i = 0; i < o->n_kept && x->kind == DL_EXPORT_FD; i++) {
            kept.fdev[kept.n] = o->kept[i].dev;
            kept.ino[kept.n++] = o->kept[i].ino;
        }
        if (o->n_kept && x->kind == DL_EXPORT_FD) /* no longer descriptors to match imports against */
            for (int i = 0; i < EXPORT_FDS; i++) x->id.fds[i] = -1;
        close_kept(o);
        if (kept.n && descriptor_open(&kept)) { /* the driver keeps it: so does the charge, until closed */
            pthread_mutex_lock(&held_mu);
            if (n_held_by_fd < HELD_MAX) {
                held_by_fd[n_held_by_fd++] = kept;
                atomic_store(&any_held_by_fd, 1);
                atomic_fetch_add(&own_used[dev], (int64_t)bytes);
                pthread_mutex_unlock(&held_mu);
                if (fd >= 0) close(fd);
                return;
            }
            pthread_mutex_unlock(&held_mu);
        }
        leave_entry(g, idx, fd);
        if (fd >= 0) close(fd);
        return;
    }
    if (fd >= 0) close(fd);
}
