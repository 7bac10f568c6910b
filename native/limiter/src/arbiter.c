/*
 * Elastic compute: what share of a GPU a claim may take now.
 *
 * A claim's device has a floor (cores=, guaranteed under contention whenever the claim has work), a ceiling
 * (limit=, default the floor) and a class (priority=: latency, standard, besteffort), all from the agent's
 * limits file. Every limiter claim on the GPU with cores < 100 takes part, fixed shares included. The node
 * agent keeps, per GPU, a directory the container sees read-only at GPUS_ROOT/<gpu-uuid>/ (README.md, "Elastic
 * compute"): a board naming every claim on the GPU with its floor, ceiling and class, and one activity file per
 * claim, which only that claim's processes write (through their own read-write mount of it). A claim counts as
 * active while its demand_until_ns lies ahead of the clock; the library sets it ahead at every admitted or
 * waiting launch, by the time its admitted work covers and DEMAND_NS more.
 *
 * The share of a claim C, with A the active claims other than C (C itself counts as active: it is launching):
 *   - a latency claim in A, and C not latency: C gets its floor (besteffort: nothing) - no one borrows;
 *   - otherwise the guaranteed floors of C and A (a besteffort claim's is 0) are taken off 100; what is left is
 *     split among the claims that may borrow (all of them, or only the latency ones when one is active), in
 *     proportion to their floors, none above its ceiling (water-filling). C gets its floor plus its part.
 * Every process of every claim works this out for itself from the same files, so the claims agree without
 * talking, and a claim waking up is seen by the others at their next admission: reclaim waits for no agent tick.
 *
 * Cost on the throttled path: one load of the board's sequence number, one load per other claim of its
 * demand_until_ns, and, when the set of active claims changed since this thread last looked, the water-filling
 * (a few hundred nanoseconds for tens of claims). A changed sequence number maps the activity files again
 * (open() then, under a lock). A thread caches the last answer for one device.
 *
 * What a tenant cannot do: its floor, ceiling and class come from the agent's limits file; the others' from the
 * agent's board, on a read-only mount, owned by root, of the exact size and magic (else the claim runs its fixed
 * floor, with one log line). It can write only its own activity file: claiming to be active holds the others to
 * their floors and takes nothing from them; claiming to be idle only lets others borrow from it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "arbiter.h"

#define BOARD_BYTES 16384
#define BOARD_VERSION 2 /* dra_gpu.limiter_abi.board.BOARD_VERSION: 160-byte entries, claim UIDs up to 128 bytes */
#define BOARD_MAX 100   /* floors are whole percents of at least 1, and the agent keeps their sum at most 100 */
#define UID_BYTES 128   /* the longest claim UID the agent accepts; NUL-padded on the board, not NUL-terminated */
#define ACTIVITY_BYTES 4096
#define ACTIVITY_VERSION 1
#define DEMAND_NS 1000000LL          /* a claim counts as active this long after the work it has admitted */
#define BESTEFFORT_BURST_NS 200000LL /* how far ahead of wall time a besteffort claim's admitted work may run */
#define MAPS_MAX 1024 /* activity files mapped by one process over its life (never unmapped: see below) */
#define DEVS ((DL_MAX_CLAIMS + 2) * DL_MAX_DEVICES) /* region device handles (region.c) */

struct board_entry {
    char claim_uid[UID_BYTES];
    uint32_t floor, ceiling, priority, reserved;
    uint64_t reserved2[2];
};
struct board {
    char magic[8];
    uint32_t version, n;
    _Atomic uint64_t seq;
    char zero[40];
    struct board_entry e[BOARD_MAX];
};
_Static_assert(sizeof(struct board_entry) == 160, "board entry layout");
_Static_assert(offsetof(struct board, e) == 64 && sizeof(struct board) <= BOARD_BYTES, "board layout");

struct activity {
    char magic[8];
    uint32_t version, zero;
    _Atomic int64_t demand_until_ns, used_ns, borrowed_ns, waiting, held_ns;
};
_Static_assert(offsetof(struct activity, demand_until_ns) == 16 && offsetof(struct activity, held_ns) == 48,
               "activity layout");

/* Another claim's activity file, mapped read-only, with its board entry's terms. Never unmapped: a thread may
 * still be reading it when the board changes (a claim leaving costs this process 4 KiB of address space). */
struct peer {
    const struct activity *act;
    int floor, ceiling, priority;
    dev_t dev;
    ino_t ino;
    char uid[UID_BYTES + 1];
};

enum { UNBOUND, BOUND, ELASTIC, FIXED };
static struct arb {
    _Atomic int state;
    pthread_mutex_t mu; /* setting up and mapping again */
    char uuid[DL_UUID_LEN];
    char self_uid[UID_BYTES + 1]; /* this claim's UID: its entry on the board */
    int floor, ceiling, priority;
    const struct board *board;
    struct activity *own;
    _Atomic uint64_t seq; /* of the board the peers were read from */
    _Atomic int n;
    _Atomic(struct peer *) peers[BOARD_MAX];
    _Atomic int share_milli; /* the last share worked out, for borrowed_ns */
} arbs[DEVS];

static struct peer *maps[MAPS_MAX];
static int n_maps; /* under the device's mu: maps are found by any device, so under map_mu */
static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;

static __thread __attribute__((tls_model("initial-exec"))) struct {
    int dev; /* + 1 */
    uint64_t seq;
    uint64_t mask[2];
    double wall_per_gpu;
    int held, borrowing;
} cache;

void dl_arbiter_bind(int dev, const char *uuid) {
    if (dev < 0 || dev >= DEVS) return;
    struct arb *a = &arbs[dev];
    pthread_mutex_lock(&a->mu);
    if (atomic_load(&a->state) == UNBOUND) {
        snprintf(a->uuid, sizeof a->uuid, "%s", uuid);
        atomic_store_explicit(&a->state, BOUND, memory_order_release);
    }
    pthread_mutex_unlock(&a->mu);
}

void dl_arbiter_reset_after_fork(void) {
    /* The mappings are shared and stay valid in the child; only the locks are the parent's. */
    for (int i = 0; i < DEVS; i++) pthread_mutex_init(&arbs[i].mu, NULL);
    pthread_mutex_init(&map_mu, NULL);
}

/* The file at path, opened read-only or read-write, checked to be a regular file of exactly bytes bytes
 * beginning with magic, mapped shared. NULL with *why set. */
static void *map_file(const char *path, size_t bytes, const char *magic, uint32_t version, int writable,
                      struct stat *st, const char **why) {
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        *why = errno == ENOENT ? "it is missing" : "it cannot be opened";
        return NULL;
    }
    void *p = NULL;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || (size_t)st->st_size != bytes) *why = "not a file of its size";
    else if ((p = mmap(NULL, bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0)) == MAP_FAILED)
        p = NULL, *why = "it cannot be mapped";
    else if (memcmp(p, magic, 8) != 0 || ((const uint32_t *)p)[2] != version) {
        munmap(p, bytes);
        p = NULL;
        *why = "it has another magic or layout version";
    }
    if (p && !writable) {
        /* The agent's files: on a read-only mount, owned by root - the claim cannot have written them. */
        struct statvfs sv;
        if (st->st_uid != 0 || fstatvfs(fd, &sv) != 0 || !(sv.f_flag & ST_RDONLY)) {
            munmap(p, bytes);
            p = NULL;
            *why = "it is not on a read-only mount or not owned by root";
        }
    }
    close(fd);
    return p;
}

static int uid_ok(const char *uid) {
    size_t n = strnlen(uid, UID_BYTES + 1);
    return n > 0 && n <= UID_BYTES && !strchr(uid, '/') && strcmp(uid, ".") != 0 && strcmp(uid, "..") != 0;
}

/* The mapping of a claim's activity file (a mapping already made of the same file is reused). map_mu held. */
static struct peer *peer_map(const struct arb *a, const char *uid) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s/%s.activity", dl_gpus_root(), a->uuid, uid);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    for (int i = 0; i < n_maps; i++)
        if (maps[i]->dev == st.st_dev && maps[i]->ino == st.st_ino && strcmp(maps[i]->uid, uid) == 0) return maps[i];
    if (n_maps == MAPS_MAX) return NULL;
    const char *why = NULL;
    const struct activity *act = map_file(path, ACTIVITY_BYTES, "DGPUACT1", ACTIVITY_VERSION, 0, &st, &why);
    if (!act) return NULL;
    struct peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->act = act;
    p->dev = st.st_dev;
    p->ino = st.st_ino;
    snprintf(p->uid, sizeof p->uid, "%s", uid);
    maps[n_maps++] = p;
    return p;
}

/* Reads the board's entries (again, when its sequence number moved) and maps the other claims' activity files.
 * Returns whether this claim is on the board. a->mu held. */
static int read_board(struct arb *a, const char *self_uid) {
    static struct board_entry e[BOARD_MAX];
    uint32_t n = 0;
    uint64_t seq = 0;
    for (int tries = 0;; tries++) {
        seq = atomic_load_explicit(&a->board->seq, memory_order_acquire);
        n = __atomic_load_n(&a->board->n, __ATOMIC_RELAXED);
        if (n > BOARD_MAX) n = BOARD_MAX;
        memcpy(e, (const void *)a->board->e, n * sizeof e[0]);
        atomic_thread_fence(memory_order_acquire);
        if (!(seq & 1) && atomic_load_explicit(&a->board->seq, memory_order_relaxed) == seq) break;
        if (tries > 1000) return -1; /* the agent is writing: keep what we had, try again at the next launch */
        sched_yield();
    }
    int found = 0, k = 0;
    pthread_mutex_lock(&map_mu);
    for (uint32_t i = 0; i < n; i++) {
        char uid[UID_BYTES + 1];
        memcpy(uid, e[i].claim_uid, UID_BYTES);
        uid[UID_BYTES] = '\0';
        if (!uid_ok(uid)) continue;
        if (strcmp(uid, self_uid) == 0) {
            found = 1;
            continue;
        }
        if (e[i].floor < 1 || e[i].floor > 100 || e[i].ceiling < e[i].floor || e[i].ceiling > 100 || e[i].priority > 2)
            continue;
        struct peer *p = peer_map(a, uid);
        if (!p) continue; /* no activity file (yet): it has never been active */
        /* Terms are written once per mapping; a claim prepared again with other terms gets a new file. */
        p->floor = (int)e[i].floor;
        p->ceiling = (int)e[i].ceiling;
        p->priority = (int)e[i].priority;
        atomic_store_explicit(&a->peers[k++], p, memory_order_release);
    }
    pthread_mutex_unlock(&map_mu);
    atomic_store_explicit(&a->n, k, memory_order_release);
    atomic_store_explicit(&a->seq, seq, memory_order_release);
    return found;
}

/* First throttled launch on the device: its terms, the board and its own activity file. a->mu held. */
static void set_up(struct arb *a) {
    int i = 0, c = dl_claim_device(&dl_claims, a->uuid, &i);
    if (c < 0 || dl_claims.claims[c].broken || dl_claims.claims[c].devices[i].cores >= 100) {
        atomic_store(&a->state, FIXED); /* no claim of a limits file: the environment's fixed share */
        return;
    }
    const struct dl_claim *cl = &dl_claims.claims[c];
    const struct dl_claim_device *d = &cl->devices[i];
    int env = dl_cfg.cores; /* the environment can only lower */
    a->floor = d->cores < env ? d->cores : env;
    a->ceiling = d->ceiling < env ? d->ceiling : env;
    a->priority = d->priority;
    snprintf(a->uuid, sizeof a->uuid, "%s", d->uuid); /* the agent's spelling (a MIG instance's "MIG-..."), for paths */
    char path[4400];
    const char *why = NULL;
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/board", dl_gpus_root(), a->uuid);
    a->board = map_file(path, BOARD_BYTES, "DGPUBRD1", BOARD_VERSION, 0, &st, &why);
    if (a->board) {
        snprintf(path, sizeof path, "%s/%s.activity", cl->state_dir, a->uuid);
        a->own = map_file(path, ACTIVITY_BYTES, "DGPUACT1", ACTIVITY_VERSION, 1, &st, &why);
    }
    snprintf(a->self_uid, sizeof a->self_uid, "%s", cl->uid);
    int on_board = a->board && a->own ? read_board(a, a->self_uid) : 0;
    if (a->board && a->own && on_board <= 0) why = "this claim is not on the board";
    if (!a->board || !a->own || on_board <= 0) {
        /* A fixed share where the agent keeps no arbitration directory (an agent before elastic compute) loses
         * nothing: said only at debug level. */
        int asked = a->ceiling > a->floor || a->priority != DL_PRIORITY_STANDARD;
        dl_log(asked || strcmp(why, "it is missing") != 0 ? DL_LOG_WARN : DL_LOG_DEBUG,
               "elastic compute on %s: %s: %s; claim %s runs its fixed floor of %d%%", a->uuid, path, why, cl->name,
               a->floor);
        atomic_store(&a->state, FIXED);
        return;
    }
    if (a->ceiling > a->floor || a->priority != DL_PRIORITY_STANDARD)
        dl_debug("elastic compute on %s: floor %d%%, ceiling %d%%, class %d", a->uuid, a->floor, a->ceiling,
                 a->priority);
    atomic_store_explicit(&a->state, ELASTIC, memory_order_release);
}

/* The water-filling of the header comment. Returns the share in percent (0: may not run). */
static double share_of(const struct arb *a, struct peer *const *act, int n, int *held) {
    int latency = 0;
    for (int i = 0; i < n; i++) latency |= act[i]->priority == DL_PRIORITY_LATENCY;
    *held = latency && a->priority != DL_PRIORITY_LATENCY;
    latency |= a->priority == DL_PRIORITY_LATENCY; /* then only latency claims borrow */
    int self_g = a->priority == DL_PRIORITY_BESTEFFORT ? 0 : a->floor;
    if (*held) return self_g;
    double spare = 100.0 - self_g, want[BOARD_MAX + 1], weight[BOARD_MAX + 1], got[BOARD_MAX + 1];
    int m = 0, self = -1;
    for (int i = 0; i < n; i++) {
        int g = act[i]->priority == DL_PRIORITY_BESTEFFORT ? 0 : act[i]->floor;
        spare -= g;
        if (latency && act[i]->priority != DL_PRIORITY_LATENCY) continue;
        if (act[i]->ceiling > g) want[m] = act[i]->ceiling - g, weight[m] = act[i]->floor, got[m++] = 0;
    }
    if (a->ceiling > self_g) self = m, want[m] = a->ceiling - self_g, weight[m] = a->floor, got[m++] = 0;
    if (self < 0 || spare <= 0) return self_g;
    /* Water-filling: split what is left by weight; a claim that reaches its ceiling gives the rest back. */
    for (int round = 0; round <= m && spare > 1e-9; round++) {
        double w = 0;
        for (int j = 0; j < m; j++)
            if (got[j] < want[j]) w += weight[j];
        if (w <= 0) break;
        double given = 0;
        for (int j = 0; j < m; j++) {
            if (got[j] >= want[j]) continue;
            double part = spare * weight[j] / w;
            if (got[j] + part > want[j]) part = want[j] - got[j];
            got[j] += part;
            given += part;
        }
        spare -= given;
    }
    return self_g + got[self];
}

/* Whether the device takes part in arbitration, once it is set up. */
static int set_up_once(struct arb *a) {
    pthread_mutex_lock(&a->mu);
    if (atomic_load(&a->state) == BOUND) set_up(a);
    pthread_mutex_unlock(&a->mu);
    return atomic_load(&a->state) == ELASTIC;
}

void dl_arbiter_share(int dev, int64_t now, double fixed, int64_t burst, struct dl_share *out) {
    out->wall_per_gpu = fixed;
    out->held = 0;
    out->elastic = 0;
    out->borrowing = 0;
    out->burst_ns = burst;
    if (DL_UNLIKELY(dev < 0 || dev >= DEVS)) return;
    struct arb *a = &arbs[dev];
    int state = atomic_load_explicit(&a->state, memory_order_acquire);
    if (DL_LIKELY(state == FIXED || state == UNBOUND)) return;
    if (DL_UNLIKELY(state == BOUND) && !set_up_once(a)) return;
    out->elastic = 1;
    /* A besteffort claim keeps little queued: a latency claim's request waits behind what it has queued. */
    if (a->priority == DL_PRIORITY_BESTEFFORT && burst > BESTEFFORT_BURST_NS) out->burst_ns = BESTEFFORT_BURST_NS;
    uint64_t seq = atomic_load_explicit(&a->board->seq, memory_order_acquire);
    if (DL_UNLIKELY(seq != atomic_load_explicit(&a->seq, memory_order_acquire))) {
        pthread_mutex_lock(&a->mu);
        if (seq != atomic_load(&a->seq) && !(seq & 1)) read_board(a, a->self_uid);
        pthread_mutex_unlock(&a->mu);
    }
    int n = atomic_load_explicit(&a->n, memory_order_acquire);
    struct peer *active[BOARD_MAX];
    uint64_t mask[2] = {0, 0};
    int k = 0;
    for (int i = 0; i < n; i++) {
        struct peer *p = atomic_load_explicit(&a->peers[i], memory_order_acquire);
        if (atomic_load_explicit(&p->act->demand_until_ns, memory_order_relaxed) > now) {
            mask[i >> 6] |= 1ull << (i & 63);
            active[k++] = p;
        }
    }
    uint64_t cur = atomic_load_explicit(&a->seq, memory_order_relaxed);
    if (cache.dev == dev + 1 && cache.seq == cur && cache.mask[0] == mask[0] && cache.mask[1] == mask[1]) {
        out->held = cache.held;
        out->borrowing = cache.borrowing;
        out->wall_per_gpu = cache.wall_per_gpu;
        return;
    }
    int held;
    double share = share_of(a, active, k, &held);
    atomic_store_explicit(&a->share_milli, (int)(share * 1000), memory_order_relaxed);
    cache.dev = dev + 1;
    cache.seq = cur;
    cache.mask[0] = mask[0];
    cache.mask[1] = mask[1];
    cache.held = held;
    cache.borrowing = share > a->floor;
    cache.wall_per_gpu = share > 0.01 ? 100.0 / share : -1.0;
    out->held = held;
    out->borrowing = cache.borrowing;
    out->wall_per_gpu = cache.wall_per_gpu;
}

double dl_arbiter_last_wall_per_gpu(int dev, double fixed) {
    if (dev < 0 || dev >= DEVS || atomic_load_explicit(&arbs[dev].state, memory_order_acquire) != ELASTIC) return fixed;
    int share = atomic_load_explicit(&arbs[dev].share_milli, memory_order_relaxed);
    return share > 0 ? 100000.0 / share : fixed;
}

static struct activity *own(int dev) {
    if (dev < 0 || dev >= DEVS) return NULL;
    return atomic_load_explicit(&arbs[dev].state, memory_order_acquire) == ELASTIC ? arbs[dev].own : NULL;
}

void dl_arbiter_admitted(int dev, int64_t until) {
    struct activity *o = own(dev);
    if (!o) return;
    int64_t want = until + DEMAND_NS, d = atomic_load_explicit(&o->demand_until_ns, memory_order_relaxed);
    /* Written only when it moves by an eighth of DEMAND_NS: the line is read by every other claim's launches. */
    while (want > d + DEMAND_NS / 8 && !atomic_compare_exchange_weak_explicit(
                                           &o->demand_until_ns, &d, want, memory_order_relaxed, memory_order_relaxed)) {
    }
}

void dl_arbiter_waiting(int dev, int delta, int64_t now) {
    struct activity *o = own(dev);
    if (!o) return;
    atomic_fetch_add_explicit(&o->waiting, delta, memory_order_relaxed);
    if (delta > 0) dl_arbiter_admitted(dev, now);
}

void dl_arbiter_slept(int dev, int64_t ns, int held) {
    struct activity *o = own(dev);
    if (o && held) atomic_fetch_add_explicit(&o->held_ns, ns, memory_order_relaxed);
}

void dl_arbiter_charged(int dev, int64_t ns) {
    struct activity *o = own(dev);
    if (!o) return;
    atomic_fetch_add_explicit(&o->used_ns, ns, memory_order_relaxed);
    int share = atomic_load_explicit(&arbs[dev].share_milli, memory_order_relaxed);
    if (share > arbs[dev].floor * 1000 && ns > 0)
        atomic_fetch_add_explicit(&o->borrowed_ns, (int64_t)((double)ns * (share - arbs[dev].floor * 1000) / share),
                                  memory_order_relaxed);
}
