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
 * Cost on the throttled path: one load of the board's sequence number, one load per other claim of its demand as
 * this process last read it, and, when the set of active claims changed since this thread last looked, the
 * water-filling (a few hundred nanoseconds for tens of claims). The other claims' activity files are read with
 * pread() of a bounded size, at most every REFRESH_NS (and when a demand read then runs out: a claim is taken
 * as idle only from a read made after its demand ended), by one thread of the process at a time (the others keep
 * going on what it last read): never mapped, since a claim can truncate its own file, and a mapping of a
 * truncated file faults in every reader. A changed sequence number opens the activity files again (under a lock).
 * A thread caches the last answer for one device.
 *
 * What a tenant cannot do: its floor, ceiling and class come from the agent's limits file; the others' from the
 * agent's board, on a read-only mount, owned by root, of the exact size and magic (else the claim runs its fixed
 * floor, with one log line). It can write only its own activity file: claiming to be active holds the others to
 * their floors and takes nothing from them; claiming to be idle only lets others borrow from it. Whatever its
 * file holds (any size, bytes or timing), the others read DEMAND_READ bytes of it without blocking, and count
 * its demand only with their magic, version and boot, and only up to DEMAND_MAX_NS ahead of their clock: a
 * word of another boot, or one claiming demand for longer than any launch leaves, counts as idle. A claim that
 * says it is busy while the driver sees it run nothing is marked on the board by the agent (FLAG_CONTRADICTED),
 * and its word then counts for nothing at all, from the first launch after the agent's write.
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
#include "fork.h"
#include "claim_limits.h"
#include "clock.h"
#include "common.h"
#include "log.h"

#define BOARD_BYTES 16384
#define BOARD_VERSION 2 /* dra_gpu.limiter_abi.board.BOARD_VERSION: 160-byte entries, claim UIDs up to 128 bytes */
#define BOARD_MAX 100   /* floors are whole percents of at least 1, and the agent keeps their sum at most 100 */
#define UID_BYTES 128   /* the longest claim UID the agent accepts; NUL-padded on the board, not NUL-terminated */
#define ACTIVITY_BYTES 4096
#define ACTIVITY_VERSION 2           /* dra_gpu.limiter_abi.board.ACTIVITY_VERSION: with the boot its words belong to */
#define DEMAND_NS 1000000LL          /* a claim counts as active this long after the work it has admitted */
#define DEMAND_MAX_NS 1000000000LL   /* how far ahead a claim's demand is ever written (and read: twice that) */
#define REFRESH_NS 500000LL          /* how old the other claims' demand as this process read it may be */
#define BESTEFFORT_BURST_NS 200000LL /* how far ahead of wall time a besteffort claim's admitted work may run */
#define DEVS ((DL_MAX_CLAIMS + 2) * DL_MAX_DEVICES) /* region device handles (region.c) */
/* A board entry's flag (dra_gpu.limiter_abi.board.FLAG_CONTRADICTED): the driver sees the claim run nothing while
 * its activity file says it wants the GPU. Its demand is not counted: it holds no one back until the agent clears
 * the flag (the driver sees it run again). */
#define FLAG_CONTRADICTED 1u

struct board_entry {
    char claim_uid[UID_BYTES];
    uint32_t floor, ceiling, priority, flags; /* flags: zero in a board of an agent before them */
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
    _Atomic uint64_t boot[2]; /* the boot the words belong to (the kernel's boot_id), written before demand */
};
_Static_assert(offsetof(struct activity, demand_until_ns) == 16 && offsetof(struct activity, held_ns) == 48 &&
                   offsetof(struct activity, boot) == 56,
               "activity layout");
#define DEMAND_READ sizeof(struct activity) /* what is read of another claim's file: the header and the words */

/* Another claim on the board, as this process opened its activity file (under the device's mu only). */
struct peer {
    int fd; /* -1: none */
    dev_t dev;
    ino_t ino;
    char uid[UID_BYTES + 1];
};
/* What the launch path reads of the other claims: their terms (board order, written under mu, published by seq)
 * and their demand as last read (0: idle, or a word not counted). */
struct view {
    _Atomic int floor[BOARD_MAX], ceiling[BOARD_MAX], priority[BOARD_MAX];
    _Atomic int64_t demand[BOARD_MAX];
    struct peer peers[BOARD_MAX]; /* under mu, as the two below (read_board's) */
    struct board_entry e[BOARD_MAX];
    struct peer old[BOARD_MAX];
};

enum { UNBOUND, BOUND, ELASTIC, FIXED };
static struct arb {
    _Atomic int state;
    pthread_mutex_t mu; /* setting up, reading the board and the other claims' files */
    char uuid[DL_UUID_LEN];
    char self_uid[UID_BYTES + 1]; /* this claim's UID: its entry on the board */
    int floor, ceiling, priority;
    const struct board *board;
    struct activity *own;
    struct view *view;
    _Atomic uint64_t seq;    /* of the board the view was read from; odd: none read yet (retried) */
    _Atomic int n;           /* other claims in the view */
    _Atomic int listed;      /* this claim is on the board it was read from (else: its fixed floor) */
    _Atomic int bad_layout;  /* the board was seen in another layout version (said once) */
    _Atomic int64_t read_at; /* when the others' demand was last read (0: read it at the next launch) */
    _Atomic int64_t expiry;  /* the first demand read then to run out: a claim going idle is read again, never
                              * taken from an old read (which may miss that it asked for more since) */
    _Atomic int share_milli; /* the last share worked out, for borrowed_ns */
} arbs[DEVS];

static uint64_t boot[2];   /* this boot's id (0, 0: unknown, and then no word is refused for its boot) */
static int boot_known = 0; /* set once, at the first set-up, under that device's mu and before its state */
static pthread_once_t boot_once = PTHREAD_ONCE_INIT;

static __thread __attribute__((tls_model("initial-exec"))) struct {
    int dev; /* + 1 */
    uint64_t seq;
    uint64_t mask[2];
    double wall_per_gpu;
    int held, borrowing;
} cache;

/* The kernel's boot id, as 16 bytes (the agent writes the same bytes: uuid.UUID(text).bytes). */
static void read_boot(void) {
    char text[64] = {0};
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t r = read(fd, text, sizeof text - 1);
    close(fd);
    unsigned char b[16];
    int k = 0;
    for (ssize_t i = 0; i < r && k < 32; i++) {
        char c = text[i];
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (c == '-') continue;
        if (v < 0) break;
        if (k % 2 == 0) b[k / 2] = (unsigned char)(v << 4);
        else b[k / 2] |= (unsigned char)v;
        k++;
    }
    if (k != 32) return;
    memcpy(boot, b, sizeof boot);
    boot_known = 1;
}

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

static void dl_arbiter_reset_after_fork(void) {
    /* The mappings and descriptors are shared and stay valid in the child; only the locks are the parent's. */
    for (int i = 0; i < DEVS; i++) pthread_mutex_init(&arbs[i].mu, NULL);
}
DL_FORK_HANDLERS(DL_FORK_ARBITER, NULL, NULL, dl_arbiter_reset_after_fork);

/* The file at path, opened read-only or read-write, checked to be a regular file of exactly bytes bytes
 * beginning with magic and version, mapped shared. NULL with *why set. */
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

/* Opens another claim's activity file into *p (a descriptor of the same file in old is taken over). Read-only,
 * never mapped, never followed, never waited on: a regular file of the agent's directory, or nothing. mu held. */
static void peer_open(const struct arb *a, const char *uid, struct peer *old, int n_old, struct peer *p) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s/%s.activity", dl_gpus_root(), a->uuid, uid);
    snprintf(p->uid, sizeof p->uid, "%s", uid);
    p->fd = -1;
    struct stat st;
    if (stat(path, &st) != 0) return;
    for (int i = 0; i < n_old; i++)
        if (old[i].fd >= 0 && old[i].dev == st.st_dev && old[i].ino == st.st_ino && strcmp(old[i].uid, uid) == 0) {
            p->fd = old[i].fd, p->dev = old[i].dev, p->ino = old[i].ino;
            old[i].fd = -1;
            return;
        }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    p->fd = fd, p->dev = st.st_dev, p->ino = st.st_ino;
}

/* A claim's demand as its file says it (0: idle, or a word not counted): DEMAND_READ bytes at most, whatever the
 * file's size; the agent's magic and version; this boot's; no further ahead than DEMAND_MAX_NS twice over. */
static int64_t demand_of(int fd, int64_t now) {
    struct activity w;
    if (fd < 0 || pread(fd, &w, DEMAND_READ, 0) != (ssize_t)DEMAND_READ) return 0;
    if (memcmp(w.magic, "DGPUACT1", 8) != 0 || w.version != ACTIVITY_VERSION) return 0;
    if (boot_known && (w.boot[0] != boot[0] || w.boot[1] != boot[1])) return 0;
    int64_t d = w.demand_until_ns;
    return d > now && d - now <= 2 * DEMAND_MAX_NS ? d : 0;
}

/* Reads every other claim's demand into the view. mu held. */
static void read_demand(struct arb *a, int64_t now) {
    int n = atomic_load_explicit(&a->n, memory_order_relaxed);
    int64_t expiry = INT64_MAX;
    for (int i = 0; i < n; i++) {
        int64_t d = demand_of(a->view->peers[i].fd, now);
        if (d && d < expiry) expiry = d;
        atomic_store_explicit(&a->view->demand[i], d, memory_order_relaxed);
    }
    atomic_store_explicit(&a->expiry, expiry, memory_order_relaxed);
    atomic_store_explicit(&a->read_at, now, memory_order_release);
}

/* Reads the board's entries (again, when its sequence number moved) and opens the other claims' activity files.
 * 0: read; -1: the agent is writing it (what was read before stays, and it is read again at a later launch).
 * a->mu held. */
static int read_board(struct arb *a, int64_t now) {
    struct view *v = a->view;
    struct board_entry *e = v->e;
    struct peer *old = v->old;
    uint32_t n = 0, version = 0;
    uint64_t seq = 0;
    for (int tries = 0;; tries++) {
        seq = atomic_load_explicit(&a->board->seq, memory_order_acquire);
        version = __atomic_load_n(&a->board->version, __ATOMIC_RELAXED);
        n = __atomic_load_n(&a->board->n, __ATOMIC_RELAXED);
        if (n > BOARD_MAX) n = BOARD_MAX;
        memcpy(e, (const void *)a->board->e, n * sizeof e[0]);
        atomic_thread_fence(memory_order_acquire);
        if (!(seq & 1) && atomic_load_explicit(&a->board->seq, memory_order_relaxed) == seq) break;
        if (tries > 100) return -1;
        sched_yield();
    }
    if (version != BOARD_VERSION) {
        /* An agent of another release rewrote the board in its own layout (a rollback): its entries are not
         * these, so none is read, and the claim is off the board for good (a later agent moves that file aside). */
        if (!atomic_exchange(&a->bad_layout, 1))
            dl_warn("elastic compute on %s: the board is now of layout version %u, not %d; this claim runs its fixed "
                    "floor of %d%% until its processes restart",
                    a->uuid, version, BOARD_VERSION, a->floor);
        n = 0;
    }
    int n_old = atomic_load_explicit(&a->n, memory_order_relaxed);
    memcpy(old, v->peers, (size_t)n_old * sizeof old[0]);
    int found = 0, k = 0;
    for (uint32_t i = 0; i < n; i++) {
        char uid[UID_BYTES + 1];
        memcpy(uid, e[i].claim_uid, UID_BYTES);
        uid[UID_BYTES] = '\0';
        if (!uid_ok(uid)) continue;
        if (strcmp(uid, a->self_uid) == 0) {
            found = 1;
            continue;
        }
        if (e[i].floor < 1 || e[i].floor > 100 || e[i].ceiling < e[i].floor || e[i].ceiling > 100 || e[i].priority > 2)
            continue;
        if (e[i].flags & FLAG_CONTRADICTED) continue; /* its word is not counted: as a claim that never ran */
        peer_open(a, uid, old, n_old, &v->peers[k]);
        if (v->peers[k].fd < 0) continue; /* no activity file (yet): it has never been active */
        atomic_store_explicit(&v->floor[k], (int)e[i].floor, memory_order_relaxed);
        atomic_store_explicit(&v->ceiling[k], (int)e[i].ceiling, memory_order_relaxed);
        atomic_store_explicit(&v->priority[k], (int)e[i].priority, memory_order_relaxed);
        k++;
    }
    for (int i = 0; i < n_old; i++)
        if (old[i].fd >= 0) close(old[i].fd); /* a claim that left: only this thread reads through it (mu) */
    atomic_store_explicit(&a->n, k, memory_order_relaxed);
    read_demand(a, now);
    if (!found && atomic_load(&a->listed) && !atomic_load(&a->bad_layout))
        dl_warn("elastic compute on %s: this claim is no longer on the board; it runs its fixed floor of %d%% until "
                "it is again",
                a->uuid, a->floor);
    atomic_store_explicit(&a->listed, found, memory_order_relaxed);
    atomic_store_explicit(&a->seq, seq, memory_order_release);
    return 0;
}

/* This process's words in its own activity file belong to this boot: a file kept over a reboot says so first,
 * its old demand taken back before (a reader that sees the new boot never sees the old demand with it). */
static void own_boot(struct activity *o) {
    if (!boot_known) return;
    if (atomic_load(&o->boot[0]) == boot[0] && atomic_load(&o->boot[1]) == boot[1]) return;
    atomic_store(&o->demand_until_ns, 0);
    atomic_store(&o->waiting, 0);
    atomic_store(&o->boot[0], boot[0]);
    atomic_store(&o->boot[1], boot[1]);
}

/* First throttled launch on the device: its terms, the board and its own activity file. a->mu held. */
static void set_up(struct arb *a) {
    pthread_once(&boot_once, read_boot);
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
    if (a->board && a->own && !(a->view = calloc(1, sizeof *a->view))) why = "no memory";
    snprintf(a->self_uid, sizeof a->self_uid, "%s", cl->uid);
    if (!a->board || !a->own || !a->view) {
        /* A fixed share where the agent keeps no arbitration directory (an agent before elastic compute) loses
         * nothing: said only at debug level. */
        int asked = a->ceiling > a->floor || a->priority != DL_PRIORITY_STANDARD;
        dl_log(asked || strcmp(why, "it is missing") != 0 ? DL_LOG_WARN : DL_LOG_DEBUG,
               "elastic compute on %s: %s: %s; claim %s runs its fixed floor of %d%%", a->uuid, path, why, cl->name,
               a->floor);
        atomic_store(&a->state, FIXED);
        return;
    }
    own_boot(a->own);
    /* A board caught mid-write is read at a later launch (seq stays odd: no board read yet), never given up on. */
    atomic_store(&a->seq, 1);
    if (read_board(a, (int64_t)dl_now_ns()) == 0 && !atomic_load(&a->listed) && !atomic_load(&a->bad_layout))
        dl_warn("elastic compute on %s: this claim is not on the board; claim %s runs its fixed floor of %d%% until "
                "it is",
                a->uuid, cl->name, a->floor);
    if (a->ceiling > a->floor || a->priority != DL_PRIORITY_STANDARD)
        dl_debug("elastic compute on %s: floor %d%%, ceiling %d%%, class %d", a->uuid, a->floor, a->ceiling,
                 a->priority);
    atomic_store_explicit(&a->state, ELASTIC, memory_order_release);
}

/* The water-filling of the header comment, over the active other claims act[0..n) (indices into the view).
 * Returns the share in percent (0: may not run). */
static double share_of(const struct arb *a, const int *act, int n, int *held) {
    const struct view *v = a->view;
    int fl[BOARD_MAX], ce[BOARD_MAX], pr[BOARD_MAX];
    int latency = 0;
    for (int i = 0; i < n; i++) {
        fl[i] = atomic_load_explicit(&v->floor[act[i]], memory_order_relaxed);
        ce[i] = atomic_load_explicit(&v->ceiling[act[i]], memory_order_relaxed);
        pr[i] = atomic_load_explicit(&v->priority[act[i]], memory_order_relaxed);
        latency |= pr[i] == DL_PRIORITY_LATENCY;
    }
    *held = latency && a->priority != DL_PRIORITY_LATENCY;
    latency |= a->priority == DL_PRIORITY_LATENCY; /* then only latency claims borrow */
    int self_g = a->priority == DL_PRIORITY_BESTEFFORT ? 0 : a->floor;
    if (*held) return self_g;
    double spare = 100.0 - self_g, want[BOARD_MAX + 1], weight[BOARD_MAX + 1], got[BOARD_MAX + 1];
    int m = 0, self = -1;
    for (int i = 0; i < n; i++) {
        int g = pr[i] == DL_PRIORITY_BESTEFFORT ? 0 : fl[i];
        spare -= g;
        if (latency && pr[i] != DL_PRIORITY_LATENCY) continue;
        if (ce[i] > g) want[m] = ce[i] - g, weight[m] = fl[i], got[m++] = 0;
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
    uint64_t seq = atomic_load_explicit(&a->board->seq, memory_order_acquire);
    int64_t read_at = atomic_load_explicit(&a->read_at, memory_order_acquire);
    if (DL_UNLIKELY(seq != atomic_load_explicit(&a->seq, memory_order_acquire) || now - read_at >= REFRESH_NS ||
                    now >= atomic_load_explicit(&a->expiry, memory_order_relaxed))) {
        /* One thread reads the files; the others go on with what it read last. */
        if (pthread_mutex_trylock(&a->mu) == 0) {
            if (!(seq & 1) && seq != atomic_load(&a->seq)) read_board(a, now);
            else if (now - atomic_load(&a->read_at) >= REFRESH_NS || now >= atomic_load(&a->expiry))
                read_demand(a, now);
            pthread_mutex_unlock(&a->mu);
        }
    }
    uint64_t cur = atomic_load_explicit(&a->seq, memory_order_acquire);
    if (DL_UNLIKELY((cur & 1) || !atomic_load_explicit(&a->listed, memory_order_relaxed))) {
        atomic_store_explicit(&a->share_milli, 0, memory_order_relaxed); /* its fixed floor, nothing borrowed */
        return;
    }
    out->elastic = 1;
    /* A besteffort claim keeps little queued: a latency claim's request waits behind what it has queued. */
    if (a->priority == DL_PRIORITY_BESTEFFORT && burst > BESTEFFORT_BURST_NS) out->burst_ns = BESTEFFORT_BURST_NS;
    int n = atomic_load_explicit(&a->n, memory_order_relaxed);
    int active[BOARD_MAX];
    uint64_t mask[2] = {0, 0};
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (atomic_load_explicit(&a->view->demand[i], memory_order_relaxed) > now) {
            mask[i >> 6] |= 1ull << (i & 63);
            active[k++] = i;
        }
    }
    if (cache.dev == dev + 1 && cache.seq == cur && cache.mask[0] == mask[0] && cache.mask[1] == mask[1]) {
        out->held = cache.held;
        out->borrowing = cache.borrowing;
        out->wall_per_gpu = cache.wall_per_gpu;
        return;
    }
    int held;
    double share = share_of(a, active, k, &held);
    atomic_store_explicit(&a->share_milli, (int)(share * 1000), memory_order_relaxed);
    double wall = share > 0.01 ? 100.0 / share : -1.0;
    /* Kept only for the board the terms were read from (a rewrite under way says nothing for the next one). */
    if (atomic_load_explicit(&a->seq, memory_order_acquire) == cur) {
        cache.dev = dev + 1;
        cache.seq = cur;
        cache.mask[0] = mask[0];
        cache.mask[1] = mask[1];
        cache.held = held;
        cache.borrowing = share > a->floor;
        cache.wall_per_gpu = wall;
    }
    out->held = held;
    out->borrowing = share > a->floor;
    out->wall_per_gpu = wall;
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

void dl_arbiter_admitted(int dev, int64_t until, int64_t now) {
    struct activity *o = own(dev);
    if (!o) return;
    int64_t want = until + DEMAND_NS, d = atomic_load_explicit(&o->demand_until_ns, memory_order_relaxed);
    if (want > now + DEMAND_MAX_NS) want = now + DEMAND_MAX_NS; /* what others count, at most (a long debt waits) */
    /* Written only when it moves by an eighth of DEMAND_NS: the line is read by every other claim's launches. */
    while (want > d + DEMAND_NS / 8 && !atomic_compare_exchange_weak_explicit(
                                           &o->demand_until_ns, &d, want, memory_order_relaxed, memory_order_relaxed)) {
    }
}

void dl_arbiter_waiting(int dev, int delta, int64_t now) {
    struct activity *o = own(dev);
    if (!o) return;
    atomic_fetch_add_explicit(&o->waiting, delta, memory_order_relaxed);
    if (delta > 0) dl_arbiter_admitted(dev, now, now);
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
