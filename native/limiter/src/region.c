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
#include "common.h"
#include "config.h"
#include "init.h"
#include "claim_limits.h"
#include "log.h"

#ifndef KCMP_FILE
#define KCMP_FILE 0 /* linux/kcmp.h */
#endif

#define REGION_FILE "dragpu-limiter.region"
#define REGION_MAGIC 0x314c504741524444ULL /* "DDRAGPL1", fixed */
#define REGION_VERSION 3u /* 2: the export table; 3: slots name their process (PID namespace, start time) */
#define REGION_SLOTS 1024
#define HEADER_BYTES 4096
#define REGION_EXPORTS 128
#define HOLDER_WORDS (REGION_SLOTS / 64)
#define EXPORT_FDS (DL_EXPORT_KEY_BYTES / 4) /* descriptors of one allocation (one per export call) */

struct region_dev {
    _Alignas(64) char uuid[DL_UUID_LEN];
    _Atomic uint32_t ready;              /* 1 once uuid is written */
    _Alignas(64) _Atomic int64_t used;   /* bytes charged by all processes of the claim */
    _Alignas(64) _Atomic int64_t tat_ns; /* compute limiter clock, see admission.c */
};

/* Counters the node agent reads (src/dra_gpu/limiter_abi/region.py mirrors this layout). They live in what
 * was spare header space, so files made by a library without them read as zeros, never as garbage. */
struct region_stats {
    _Atomic uint64_t refused;      /* allocations refused for the claim's limit */
    _Atomic uint64_t throttled_ns; /* time launching threads slept in the compute limiter */
    _Atomic uint64_t busy_ns;      /* measured GPU time of throttled launches */
    uint64_t spare;
};

struct region_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint32_t slot_count;
    uint32_t slot_bytes;
    uint32_t device_count;
    uint32_t export_count;
    struct region_dev devs[DL_MAX_DEVICES];
    struct region_stats stats[DL_MAX_DEVICES];
};

/* in_use: 0 free, 1 owned by the process it names, SLOT_GONE: that process is gone as the node agent found it
 * (src/dra_gpu/limiter_abi/region.py): the next sweep or claim gives its bytes back. */
#define SLOT_GONE 2u

struct region_slot {
    _Alignas(64) _Atomic uint32_t in_use;
    int32_t pid;    /* as the owner's PID namespace numbers it */
    uint64_t pidns; /* that namespace's inode */
    uint64_t start; /* the owner's start time (/proc/<pid>/stat field 22): a reused PID is another process */
    _Atomic int64_t used[DL_MAX_DEVICES];
};

/* Memory one process of the claim shares with others (see the top). */
struct region_export {
    _Alignas(64) _Atomic uint32_t live; /* 1: bytes are in devs[dev].used, on behalf of the holders */
    uint32_t dev;                       /* the device entry */
    uint32_t kind;                      /* DL_EXPORT_IPC or DL_EXPORT_FD */
    int32_t pid;                        /* FD: the exporter, as its PID namespace numbers it */
    uint64_t pidns;                     /* FD: that namespace's inode */
    uint64_t spare;
    int64_t bytes;
    union {
        unsigned char key[DL_EXPORT_KEY_BYTES]; /* IPC: the handle */
        int32_t fds[EXPORT_FDS]; /* FD: descriptors the exporter keeps while it holds the memory (-1: none) */
    } id;
    _Atomic uint64_t holders[HOLDER_WORDS]; /* bit i: the process of slot i holds the memory */
};

_Static_assert(sizeof(struct region_header) <= HEADER_BYTES, "region header too large");
_Static_assert(sizeof(struct region_export) == 256, "export entries are 256 bytes (limiter_abi/region.py)");

#define SLOTS_AT (HEADER_BYTES + REGION_EXPORTS * sizeof(struct region_export))
#define REGION_BYTES (SLOTS_AT + REGION_SLOTS * sizeof(struct region_slot))

/* The floor (src/dra_gpu/limiter_abi/region.py writes it): what the node agent knows the claim's processes hold
 * on each GPU by the driver's own figures - NVML's per-process memory of the processes whose cgroups are the
 * claim's pods' - published beside the region in the read-only state directory. The claim's account never
 * falls below it, so a process that zeroes the region's counters, or marks a live process's slot gone so that
 * a sweep refunds it, gains nothing from the agent's next sample on (one monitor interval, 1 s by default).
 * `region` is the region's counter as the agent read it just before NVML: an account now below it has been
 * released from (or rewritten) since, so an allocation that only the floor refuses waits for the agent's next
 * sample (seq moves) and is decided on that, at most FLOOR_WAIT_MS. seq is odd while the agent writes. */
#define FLOOR_FILE "dragpu-limiter.floor"
#define FLOOR_MAGIC 0x314c464741524444ULL /* "DDRAGFL1" */
#define FLOOR_VERSION 1u
#define FLOOR_BYTES 4096
#define FLOOR_WAIT_MS 2500

struct floor_dev {
    char uuid[DL_UUID_LEN];
    _Atomic int64_t bytes;  /* NVML: what the claim's processes hold on this GPU */
    _Atomic int64_t region; /* the region's claim-wide count just before */
};

struct floor_file {
    uint64_t magic;
    uint32_t version;
    uint32_t device_count;
    _Atomic uint64_t seq;
    uint64_t spare[5];
    struct floor_dev devs[DL_MAX_DEVICES];
};

_Static_assert(sizeof(struct floor_dev) == 64, "floor entries are 64 bytes (limiter_abi/region.py)");
_Static_assert(sizeof(struct floor_file) <= FLOOR_BYTES, "floor file too large");

#define MAX_REGIONS (DL_MAX_CLAIMS + 2) /* the environment's, one per claim, the closed one */
#define CLOSED_REGION (MAX_REGIONS - 1)
#define LOCK_WAIT_MS 2000
#define SANE_BYTES (1LL << 52) /* no GPU has 4 PiB: a larger counter was written by something else */
#define VERIFY_EVERY_NS 100000000LL

struct region {
    char *base;
    int fd; /* -1 for private memory */
    int slot;
    bool closed;                 /* unusable: every limited allocation on its devices is refused */
    _Atomic int bad;             /* found corrupt, deleted or resized while in use: closed from then on */
    _Atomic int64_t verified_ns; /* last structural check */
    char what[64];               /* "claim ns/name" or "the environment's state directory", for messages */
    char path[4200];
    const struct floor_file *floor;       /* the node agent's floor beside a claim's region, or NULL */
    signed char floor_at[DL_MAX_DEVICES]; /* device entry -> floor entry (-1: none) */
};
static struct region regions[MAX_REGIONS];
/* This process's own charges per device handle: the shared counters can be rewritten by any process of
 * the claim, these cannot. */
static _Atomic int64_t own_used[MAX_REGIONS * DL_MAX_DEVICES];
/* The floor's sample this process last saw per device handle, and its own charges then: what it charged
 * since is on top of the floor (the floor cannot hold it yet), whatever the region's counters say. */
static _Atomic uint64_t floor_seen[MAX_REGIONS * DL_MAX_DEVICES];
static _Atomic int64_t own_at_floor[MAX_REGIONS * DL_MAX_DEVICES];
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

/* This process's PID namespace and start time, as its slot records them (0: unknown). */
static uint64_t self_pidns, self_start;

static uint64_t own_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Field 22 of /proc/<pid>/stat: 0 and *out set, 1 when no such process, -1 when it cannot be told. */
static int proc_start(int32_t pid, uint64_t *out) {
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? 1 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return n < 0 && errno == ESRCH ? 1 : -1;
    buf[n] = '\0';
    char *s = strrchr(buf, ')'); /* the command name may hold anything but ends at the last ')' */
    if (!s) return -1;
    s++;
    for (int field = 3; field < 22 && s; field++) s = strchr(s + 1, ' ');
    if (!s) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s + 1, &end, 10);
    if (errno || end == s + 1) return -1;
    *out = v;
    return 0;
}

static void know_self(void) {
    if (!self_pidns) self_pidns = own_pidns();
    if (!self_start && proc_start((int32_t)getpid(), &self_start) != 0) self_start = 0;
}

static struct region_header *hdr(const struct region *g) { return (struct region_header *)g->base; }
static struct region_slot *slot_at(const struct region *g, int i) {
    return (struct region_slot *)(g->base + SLOTS_AT) + i;
}
static struct region_export *export_at(const struct region *g, int i) {
    return (struct region_export *)(g->base + HEADER_BYTES) + i;
}
static struct region *region_of(int dev) { return &regions[dev / DL_MAX_DEVICES]; }
static int entry_of(int dev) { return dev % DL_MAX_DEVICES; }

static int lock_byte(int fd, off_t off, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = off;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

/* Waits at most LOCK_WAIT_MS for a write lock on one byte. */
static int lock_byte_bounded(int fd, off_t off) {
    long waited_us = 0, step_us = 200;
    while (lock_byte(fd, off, F_WRLCK) != 0) {
        if (errno != EAGAIN && errno != EACCES) return -1;
        if (waited_us >= LOCK_WAIT_MS * 1000L) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct timespec ts = {0, step_us * 1000L};
        nanosleep(&ts, NULL);
        waited_us += step_us;
        if (step_us < 10000) step_us *= 2;
    }
    return 0;
}

/* A new open file description of the region's file, for one locking operation (see the top). */
static int own_description(const struct region *g) {
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", g->fd);
    return open(p, O_RDWR | O_CLOEXEC);
}

static void fill_header(struct region *g) {
    struct region_header *h = hdr(g);
    h->version = REGION_VERSION;
    h->header_bytes = HEADER_BYTES;
    h->slot_count = REGION_SLOTS;
    h->slot_bytes = sizeof(struct region_slot);
    h->device_count = DL_MAX_DEVICES;
    h->export_count = REGION_EXPORTS;
    __atomic_store_n(&h->magic, REGION_MAGIC, __ATOMIC_RELEASE);
}

static int header_matches(const struct region *g) {
    const struct region_header *h = hdr(g);
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == REGION_MAGIC && h->version == REGION_VERSION &&
           h->header_bytes == HEADER_BYTES && h->slot_count == REGION_SLOTS &&
           h->slot_bytes == sizeof(struct region_slot) && h->device_count == DL_MAX_DEVICES &&
           h->export_count == REGION_EXPORTS;
}

static void mark_bad(struct region *g, const char *why) {
    if (atomic_exchange(&g->bad, 1) == 0)
        dl_error("the shared region %s (%s) %s; refusing allocations on its devices", g->path, g->what, why);
}

/* Whether a slot whose lock is free may be given back: its process is gone, by PID and start time. An unlocked
 * lock alone proves nothing (a process can unlock its own slot through the library's descriptor), and a
 * process of another PID namespace cannot be looked up from here: its slot stays charged until a process of
 * its namespace sweeps it, or until the node agent, which sees every process of the node, finds it gone and
 * marks the slot SLOT_GONE (under the slot's lock, as a sweep holds it). A slot never used names no process
 * and is free. */
static bool owner_gone(const struct region_slot *s) {
    if (atomic_load(&s->in_use) == SLOT_GONE) return true;
    int32_t pid = s->pid;
    uint64_t ns = s->pidns, start = s->start, now = 0;
    if (pid == 0 && ns == 0 && start == 0) return !atomic_load(&s->in_use);
    know_self();
    if (pid <= 0 || ns == 0 || start == 0 || ns != self_pidns) return false;
    int r = proc_start(pid, &now);
    return r == 1 || (r == 0 && now != start);
}

static void forget_owner(struct region_slot *s) {
    s->pid = 0;
    s->pidns = 0;
    s->start = 0;
}

/* Gives the bytes recorded in a slot back to the device totals. Caller holds the slot's lock. */
static void reclaim(struct region *g, int i) {
    struct region_slot *s = slot_at(g, i);
    for (int d = 0; d < DL_MAX_DEVICES; d++) {
        int64_t v = atomic_exchange(&s->used[d], 0);
        if (v < 0 || v > SANE_BYTES) mark_bad(g, "holds an impossible per-process count");
        else if (v) atomic_fetch_sub(&hdr(g)->devs[d].used, v);
    }
}

/* An export entry nobody holds any more gives its charge back. Caller holds byte 0. */
static void retire(struct region *g, struct region_export *x) {
    int64_t b = x->bytes;
    if (x->dev >= DL_MAX_DEVICES || b < 0 || b > SANE_BYTES) mark_bad(g, "holds an impossible shared-memory entry");
    else if (b) atomic_fetch_sub(&hdr(g)->devs[x->dev].used, b);
    atomic_store(&x->live, 0);
}

/* Drops the holds of the slots in gone (whose processes are dead, or not yet started) and retires the
 * entries left with no holder. Caller holds byte 0, so no process joins or exports meanwhile. */
static void drop_holders(struct region *g, const uint64_t gone[HOLDER_WORDS]) {
    for (int i = 0; i < REGION_EXPORTS; i++) {
        struct region_export *x = export_at(g, i);
        if (!atomic_load(&x->live)) continue;
        uint64_t left = 0;
        for (int w = 0; w < HOLDER_WORDS; w++) left |= atomic_fetch_and(&x->holders[w], ~gone[w]) & ~gone[w];
        if (!left) retire(g, x);
    }
}

static void set_holder(struct region_export *x, int slot) {
    atomic_fetch_or(&x->holders[slot / 64], 1ull << (slot % 64));
}

/* Caller holds byte 0. */
static int claim_slot(struct region *g) {
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < REGION_SLOTS; i++) {
            struct region_slot *s = slot_at(g, i);
            int busy = atomic_load(&s->in_use) != 0;
            if (busy != pass) continue; /* free-looking slots first, then possibly dead ones */
            if (lock_byte(g->fd, 1 + i, F_WRLCK) != 0) continue;
            if (!owner_gone(s)) { /* unlocked by its own process, or not ours to tell: still charged */
                lock_byte(g->fd, 1 + i, F_UNLCK);
                continue;
            }
            reclaim(g, i);
            uint64_t gone[HOLDER_WORDS] = {0}; /* what the slot's dead owner held (caller holds byte 0) */
            gone[i / 64] = 1ull << (i % 64);
            drop_holders(g, gone);
            know_self();
            s->pid = (int32_t)getpid();
            s->pidns = self_pidns;
            s->start = self_start;
            atomic_store(&s->in_use, 1);
            return i;
        }
    }
    return -1;
}

static void unmap(struct region *g) {
    if (g->base) munmap(g->base, REGION_BYTES);
    if (g->fd >= 0) close(g->fd);
    g->base = NULL;
    g->fd = -1;
}

/* The layout version of a region file made by a library of another version, or 0 (one of this layout, or
 * not a region at all). */
static uint32_t other_version(const struct region *g, const struct stat *st) {
    uint64_t magic = 0;
    uint32_t version = 0;
    if (st->st_size < 12 || pread(g->fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic ||
        pread(g->fd, &version, sizeof version, 8) != (ssize_t)sizeof version || magic != REGION_MAGIC)
        return 0;
    return version == REGION_VERSION && st->st_size == (off_t)REGION_BYTES ? 0 : version ? version : UINT32_MAX;
}

/* Whether any process holds a slot of the file (every layout keeps slot i's lock on byte 1 + i). */
static bool slots_held(const struct region *g) {
    for (int i = 0; i < REGION_SLOTS; i++) {
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = 1 + i;
        fl.l_len = 1;
        if (fcntl(g->fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK) return true;
    }
    return false;
}

/* Maps the node agent's floor beside a claim's region, read-only; none (an agent that makes none) is no floor. */
static void open_floor(struct region *g, const char *dir) {
    if (g->floor) munmap((void *)g->floor, FLOOR_BYTES); /* a child after fork() opens its regions again */
    g->floor = NULL;
    memset(g->floor_at, -1, sizeof g->floor_at);
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, FLOOR_FILE);
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        dl_debug("no floor %s (%s): %s", p, g->what, strerror(errno));
        return;
    }
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == FLOOR_BYTES)
        m = mmap(NULL, FLOOR_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    const struct floor_file *f = m == MAP_FAILED ? NULL : m;
    if (!f || f->magic != FLOOR_MAGIC || f->version != FLOOR_VERSION || f->device_count != DL_MAX_DEVICES) {
        dl_error("the node agent's floor %s (%s) is not one this library reads; refusing allocations on its devices", p,
                 g->what);
        if (f) munmap(m, FLOOR_BYTES);
        g->closed = true;
        return;
    }
    g->floor = f;
}

/* Links device entry e of a claim's region to the floor's entry of the same GPU. */
static void link_floor(struct region *g, int e, const char *uuid) {
    if (!g->floor || g->floor_at[e] >= 0) return;
    for (int i = 0; i < DL_MAX_DEVICES; i++)
        if (dl_uuid_equal(g->floor->devs[i].uuid, uuid)) g->floor_at[e] = (signed char)i;
}

/* The floor of device entry e (0: none), with the region's count the agent saw and the sample's seq. */
static int64_t floor_read(const struct region *g, int e, int64_t *seen, uint64_t *seq) {
    *seen = 0;
    *seq = 0;
    if (!g->floor || g->floor_at[e] < 0) return 0;
    const struct floor_dev *d = &g->floor->devs[g->floor_at[e]];
    int64_t v = 0;
    for (int tries = 0; tries < 64; tries++) {
        uint64_t s = atomic_load_explicit(&g->floor->seq, memory_order_acquire);
        v = atomic_load_explicit(&d->bytes, memory_order_relaxed);
        *seen = atomic_load_explicit(&d->region, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (!(s & 1) && atomic_load_explicit(&g->floor->seq, memory_order_relaxed) == s) {
            *seq = s;
            break;
        }
    }
    return v < 0 || v > SANE_BYTES ? SANE_BYTES : v;
}

/* The claim's account as the floor puts it: the floor, and what this process charged since the sample it is
 * of (from its own charges, mine, which no other process can rewrite). 0: no floor. */
static int64_t floor_account(int dev, int64_t floor, uint64_t seq, int64_t mine) {
    if (!floor && !seq) return 0;
    if (atomic_load_explicit(&floor_seen[dev], memory_order_relaxed) != seq) {
        atomic_store_explicit(&own_at_floor[dev], mine, memory_order_relaxed);
        atomic_store_explicit(&floor_seen[dev], seq, memory_order_relaxed);
        return floor;
    }
    int64_t since = mine - atomic_load_explicit(&own_at_floor[dev], memory_order_relaxed);
    return since > 0 ? floor + since : floor;
}

/* Waits (at most FLOOR_WAIT_MS) for the agent's next sample after seq. */
static void floor_wait(const struct region *g, uint64_t seq) {
    for (int waited_ms = 0; waited_ms < FLOOR_WAIT_MS; waited_ms += 10) {
        uint64_t now = atomic_load_explicit(&g->floor->seq, memory_order_acquire);
        if (now != seq && !(now & 1)) return;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* A claim's region (agent_made) is the node agent's: it made the file, laid out and sized, and the library
 * never creates, resizes or initialises one, so deleting, truncating or zeroing it cannot start a fresh
 * account - it closes the claim's region. Only the environment's region is made here. */
static int open_shared(struct region *g, const char *dir, int log_level, bool agent_made) {
    snprintf(g->path, sizeof g->path, "%s/%s", dir, REGION_FILE);
    const char *consequence =
        log_level == DL_LOG_ERROR ? "refusing allocations on its devices" : "limits apply to this process only";
    int created = 1;
    /* Not world-writable: the containers of a claim share it through their user or group. O_NONBLOCK: a FIFO
     * put in its place must not hang the process (it is then refused as not a regular file). */
    if (agent_made) {
        created = 0;
        g->fd = open(g->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    } else {
        g->fd = open(g->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0660);
    }
    if (g->fd < 0 && !agent_made && errno == EEXIST) {
        created = 0;
        g->fd = open(g->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    }
    if (g->fd < 0) {
        dl_log(log_level, "cannot open the shared region %s (%s): %s; %s", g->path, g->what, strerror(errno),
               consequence);
        return -1;
    }
    if (created) (void)fchmod(g->fd, 0660);
    if (lock_byte_bounded(g->fd, 0) != 0) {
        dl_log(log_level, "cannot lock the shared region %s (%s): %s; %s", g->path, g->what, strerror(errno),
               consequence);
        unmap(g);
        return -1;
    }
    const char *problem = NULL;
    struct stat st;
    uint32_t old = 0;
    if (fstat(g->fd, &st) != 0) {
        problem = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        problem = "it is not a regular file";
    } else if (agent_made && other_version(g, &st) != 0) {
        problem = "it was made for another version of the library (the claim must be prepared again)";
    } else if (agent_made && st.st_size != (off_t)REGION_BYTES) {
        problem = "it was truncated or resized (the node agent made it whole)";
    } else if ((old = other_version(g, &st)) != 0 && slots_held(g)) {
        /* Its processes and ours could not share one account: refused until they have all exited. */
        problem = "a process of the claim still uses it with another version of the library (another layout)";
    } else if (old != 0 && ftruncate(g->fd, 0) != 0) {
        problem = strerror(errno);
    } else if ((old != 0 || st.st_size == 0) && (errno = posix_fallocate(g->fd, 0, (off_t)REGION_BYTES)) != 0) {
        /* Every block allocated, not a sparse file: a write to a hole of the mapping on a full disk is SIGBUS. */
        problem = strerror(errno);
        if (ftruncate(g->fd, 0) != 0) problem = "it could not be allocated, nor emptied again";
    } else if (old == 0 && st.st_size != 0 && st.st_size != (off_t)REGION_BYTES) {
        problem = "the file has an unknown layout (its size differs)";
    } else {
        void *p = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
        if (p == MAP_FAILED) {
            problem = strerror(errno);
        } else {
            g->base = p;
            /* The claim outlived an upgrade of the library, and no process uses the old layout any more. */
            if (old)
                dl_info("made the shared region %s (%s) again: no process uses its old layout any more", g->path,
                        g->what);
            /* magic 0: we created it, made it again, or its creator died before finishing; all under the lock. */
            if (!agent_made && __atomic_load_n(&hdr(g)->magic, __ATOMIC_ACQUIRE) == 0) fill_header(g);
            if (!header_matches(g))
                problem = agent_made ? "its header was zeroed or rewritten (the node agent made it)"
                                     : "the file has an unknown layout (magic or version differ)";
        }
    }
    if (!problem && (g->slot = claim_slot(g)) < 0) problem = "all process slots are in use";
    lock_byte(g->fd, 0, F_UNLCK);
    if (problem) {
        dl_log(log_level, "cannot use the shared region %s (%s): %s; %s", g->path, g->what, problem, consequence);
        unmap(g);
        return -1;
    }
    dl_debug("using shared region %s (%s), slot %d", g->path, g->what, g->slot);
    return 0;
}

static void open_private(struct region *g, bool closed) {
    void *p = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        /* Practically unreachable: without memory to account in, refuse rather than run unlimited. */
        static char fallback[REGION_BYTES] __attribute__((aligned(64)));
        p = fallback;
        closed = true;
    }
    g->base = p;
    g->fd = -1;
    g->slot = 0;
    g->closed = closed;
    fill_header(g);
    atomic_store(&slot_at(g, 0)->in_use, 1);
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
