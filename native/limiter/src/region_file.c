/* region.c's file: locks, slots and their owners, the floor beside the region, opening and mapping it (the
 * protocol is described at the top of region.c). */
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

#include "region_file.h"
#include "common.h"
#include "config.h"
#include "log.h"

struct region regions[MAX_REGIONS];
/* This process's own charges per device handle: the shared counters can be rewritten by any process of
 * the claim, these cannot. */
_Atomic int64_t own_used[MAX_REGIONS * DL_MAX_DEVICES];
/* The floor's sample this process last saw per device handle, and its own charges then: what it charged
 * since is on top of the floor (the floor cannot hold it yet), whatever the region's counters say. */
_Atomic uint64_t floor_seen[MAX_REGIONS * DL_MAX_DEVICES];
_Atomic int64_t own_at_floor[MAX_REGIONS * DL_MAX_DEVICES];

/* This process's PID namespace and start time, as its slot records them (0: unknown). */
uint64_t self_pidns, self_start;

uint64_t own_pidns(void) {
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

int lock_byte(int fd, off_t off, short type) {
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
int lock_byte_bounded(int fd, off_t off) {
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
int own_description(const struct region *g) {
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

int header_matches(const struct region *g) {
    const struct region_header *h = hdr(g);
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == REGION_MAGIC && h->version == REGION_VERSION &&
           h->header_bytes == HEADER_BYTES && h->slot_count == REGION_SLOTS &&
           h->slot_bytes == sizeof(struct region_slot) && h->device_count == DL_MAX_DEVICES &&
           h->export_count == REGION_EXPORTS;
}

void mark_bad(struct region *g, const char *why) {
    if (atomic_exchange(&g->bad, 1) == 0)
        dl_error("the shared region %s (%s) %s; refusing allocations on its devices", g->path, g->what, why);
}

/* Whether a slot whose lock is free may be given back: its process is gone, by PID and start time. An unlocked
 * lock alone proves nothing (a process can unlock its own slot through the library's descriptor), and a
 * process of another PID namespace cannot be looked up from here: its slot stays charged until a process of
 * its namespace sweeps it, or until the node agent, which sees every process of the node, finds it gone and
 * marks the slot SLOT_GONE (under the slot's lock, as a sweep holds it). A slot never used names no process
 * and is free. */
bool owner_gone(const struct region_slot *s) {
    if (atomic_load(&s->in_use) == SLOT_GONE) return true;
    int32_t pid = s->pid;
    uint64_t ns = s->pidns, start = s->start, now = 0;
    if (pid == 0 && ns == 0 && start == 0) return !atomic_load(&s->in_use);
    know_self();
    if (pid <= 0 || ns == 0 || start == 0 || ns != self_pidns) return false;
    int r = proc_start(pid, &now);
    return r == 1 || (r == 0 && now != start);
}

void forget_owner(struct region_slot *s) {
    s->pid = 0;
    s->pidns = 0;
    s->start = 0;
}

/* Gives the bytes recorded in a slot back to the device totals. Caller holds the slot's lock. */
void reclaim(struct region *g, int i) {
    struct region_slot *s = slot_at(g, i);
    for (int d = 0; d < DL_MAX_DEVICES; d++) {
        int64_t v = atomic_exchange(&s->used[d], 0);
        if (v < 0 || v > SANE_BYTES) mark_bad(g, "holds an impossible per-process count");
        else if (v) atomic_fetch_sub(&hdr(g)->devs[d].used, v);
    }
}

/* An export entry nobody holds any more gives its charge back. Caller holds byte 0. */
void retire(struct region *g, struct region_export *x) {
    int64_t b = x->bytes;
    if (x->dev >= DL_MAX_DEVICES || b < 0 || b > SANE_BYTES) mark_bad(g, "holds an impossible shared-memory entry");
    else if (b) atomic_fetch_sub(&hdr(g)->devs[x->dev].used, b);
    atomic_store(&x->live, 0);
}

/* Drops the holds of the slots in gone (whose processes are dead, or not yet started) and retires the
 * entries left with no holder. Caller holds byte 0, so no process joins or exports meanwhile. */
void drop_holders(struct region *g, const uint64_t gone[HOLDER_WORDS]) {
    for (int i = 0; i < REGION_EXPORTS; i++) {
        struct region_export *x = export_at(g, i);
        if (!atomic_load(&x->live)) continue;
        uint64_t left = 0;
        for (int w = 0; w < HOLDER_WORDS; w++) left |= atomic_fetch_and(&x->holders[w], ~gone[w]) & ~gone[w];
        if (!left) retire(g, x);
    }
}

void set_holder(struct region_export *x, int slot) { atomic_fetch_or(&x->holders[slot / 64], 1ull << (slot % 64)); }

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

void unmap(struct region *g) {
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
void open_floor(struct region *g, const char *dir) {
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
void link_floor(struct region *g, int e, const char *uuid) {
    if (!g->floor || g->floor_at[e] >= 0) return;
    for (int i = 0; i < DL_MAX_DEVICES; i++)
        if (dl_uuid_equal(g->floor->devs[i].uuid, uuid)) g->floor_at[e] = (signed char)i;
}

/* The floor of device entry e (0: none), with the region's count the agent saw and the sample's seq. */
int64_t floor_read(const struct region *g, int e, int64_t *seen, uint64_t *seq) {
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
int64_t floor_account(int dev, int64_t floor, uint64_t seq, int64_t mine) {
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
void floor_wait(const struct region *g, uint64_t seq) {
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
int open_shared(struct region *g, const char *dir, int log_level, bool agent_made) {
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

void open_private(struct region *g, bool closed) {
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
