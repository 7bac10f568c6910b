/*
 * The claim's accounting region: one file, "dragpu-limiter.region", in the claim's state directory,
 * mapped MAP_SHARED by every limited process of every pod of the claim.
 *
 *   header   magic, layout version, sizes, and a device table keyed by GPU UUID (so pods that number
 *            their devices differently still meet on the same entry): claim-wide bytes in use and the
 *            compute limiter's shared clock per device
 *   slots    one per live process: the bytes it holds per device
 *
 * Liveness never rests on process ids (pods have separate PID namespaces): a process owns its slot by
 * holding an open-file-description (OFD) write lock on byte 1 + slot of the file. The kernel drops the
 * lock when the process dies, however it dies (SIGKILL included); the next process that locks the slot
 * (to claim it, or in a sweep before refusing an allocation) returns the dead owner's bytes to the
 * device totals. Creation and the device table are serialised by an OFD lock on byte 0.
 *
 * Counters are lock-free atomics in the shared mapping: admission is a compare-and-swap on the device
 * total against the limit, so concurrent allocations of several processes never overshoot the limit.
 * Updates go total-then-slot on charge and slot-then-total on release: a process killed between the two
 * steps leaves the total too high (the claim loses at most that one allocation's bytes until every
 * process of the claim has exited), never too low.
 *
 * When no state directory is given, or it cannot be used, the same layout lives in private anonymous
 * memory: the limits then apply to this process alone (with a warning in the second case).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "limiter.h"

#define REGION_FILE "dragpu-limiter.region"
#define REGION_MAGIC 0x314c504741524444ULL /* "DDRAGPL1", fixed */
#define REGION_VERSION 1u
#define REGION_SLOTS 1024
#define HEADER_BYTES 4096

struct region_dev {
    _Alignas(64) char uuid[DL_UUID_LEN];
    _Atomic uint32_t ready;          /* 1 once uuid is written */
    _Alignas(64) _Atomic int64_t used;    /* bytes charged by all processes of the claim */
    _Alignas(64) _Atomic int64_t tat_ns;  /* compute limiter clock, see throttle.c */
};

/* Counters the node agent reads (src/dra_gpu/monitor/region.py mirrors this layout). They live in what
 * was spare header space, so files made by a library without them read as zeros, never as garbage. */
struct region_stats {
    _Atomic uint64_t refused;       /* allocations refused for the claim's limit */
    _Atomic uint64_t throttled_ns;  /* time launching threads slept in the compute limiter */
    _Atomic uint64_t busy_ns;       /* measured GPU time of throttled launches */
    uint64_t spare;
};

struct region_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint32_t slot_count;
    uint32_t slot_bytes;
    uint32_t device_count;
    uint32_t reserved;
    struct region_dev devs[DL_MAX_DEVICES];
    struct region_stats stats[DL_MAX_DEVICES];
};

struct region_slot {
    _Alignas(64) _Atomic uint32_t in_use;
    int32_t pid;  /* for people reading the file; liveness comes from the lock */
    _Atomic int64_t used[DL_MAX_DEVICES];
};

_Static_assert(sizeof(struct region_header) <= HEADER_BYTES, "region header too large");

#define REGION_BYTES (HEADER_BYTES + REGION_SLOTS * sizeof(struct region_slot))

static struct {
    char *base;
    int fd;      /* -1 for a private region */
    int slot;
    char path[4200];
} R = {NULL, -1, 0, ""};

/* OFD locks exclude other processes, not the threads of this one (they share the open file): two threads
 * would both "win" byte 0 and add one UUID to the device table twice (charges then split between the
 * copies), or both "win" a dead slot's lock, the second one's in_use = 0 landing after a third process has
 * claimed the slot (never swept then when that process dies). The private region has no file lock at all.
 * So the threads of a process take turns here, around the file locks. */
static pthread_mutex_t proc_mu = PTHREAD_MUTEX_INITIALIZER;

static struct region_header *hdr(void) { return (struct region_header *)R.base; }
static struct region_slot *slot_at(int i) {
    return (struct region_slot *)(R.base + HEADER_BYTES) + i;
}

static int lock_byte(off_t off, short type, int wait) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = off;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(R.fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return 0;
        if (errno != EINTR) return -1;
    }
}
static void unlock_byte(off_t off) { lock_byte(off, F_UNLCK, 0); }

static void fill_header(void) {
    struct region_header *h = hdr();
    h->version = REGION_VERSION;
    h->header_bytes = HEADER_BYTES;
    h->slot_count = REGION_SLOTS;
    h->slot_bytes = sizeof(struct region_slot);
    h->device_count = DL_MAX_DEVICES;
    __atomic_store_n(&h->magic, REGION_MAGIC, __ATOMIC_RELEASE);
}

static int header_matches(void) {
    const struct region_header *h = hdr();
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == REGION_MAGIC && h->version == REGION_VERSION &&
           h->header_bytes == HEADER_BYTES && h->slot_count == REGION_SLOTS &&
           h->slot_bytes == sizeof(struct region_slot) && h->device_count == DL_MAX_DEVICES;
}

/* Gives the bytes recorded in a slot back to the device totals. Caller holds the slot's lock. */
static void reclaim(int i) {
    struct region_slot *s = slot_at(i);
    for (int d = 0; d < DL_MAX_DEVICES; d++) {
        int64_t v = atomic_exchange(&s->used[d], 0);
        if (v) atomic_fetch_sub(&hdr()->devs[d].used, v);
    }
}

static int claim_slot(void) {
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < REGION_SLOTS; i++) {
            struct region_slot *s = slot_at(i);
            int busy = atomic_load(&s->in_use) != 0;
            if (busy != pass) continue;  /* free-looking slots first, then possibly dead ones */
            if (lock_byte(1 + i, F_WRLCK, 0) != 0) continue;
            reclaim(i);
            s->pid = (int32_t)getpid();
            atomic_store(&s->in_use, 1);
            return i;
        }
    }
    return -1;
}

static void close_shared(void) {
    if (R.base) munmap(R.base, REGION_BYTES);
    if (R.fd >= 0) close(R.fd);
    R.base = NULL;
    R.fd = -1;
}

static int open_shared(const char *dir) {
    snprintf(R.path, sizeof R.path, "%s/%s", dir, REGION_FILE);
    int created = 1;
    R.fd = open(R.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (R.fd < 0 && errno == EEXIST) {
        created = 0;
        R.fd = open(R.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    }
    if (R.fd < 0) {
        dl_warn("cannot open the shared region %s: %s; limits apply to this process only", R.path,
                strerror(errno));
        return -1;
    }
    /* Containers of one claim may run as different users: let every one of them open the file. */
    if (created) (void)fchmod(R.fd, 0666);
    if (lock_byte(0, F_WRLCK, 1) != 0) {
        dl_warn("cannot lock the shared region %s: %s; limits apply to this process only", R.path,
                strerror(errno));
        close_shared();
        return -1;
    }
    const char *problem = NULL;
    struct stat st;
    if (fstat(R.fd, &st) != 0) {
        problem = strerror(errno);
    } else if (st.st_size == 0 && ftruncate(R.fd, (off_t)REGION_BYTES) != 0) {
        problem = strerror(errno);
    } else if (st.st_size != 0 && st.st_size != (off_t)REGION_BYTES) {
        problem = "the file has an unknown layout (its size differs)";
    } else {
        void *p = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, R.fd, 0);
        if (p == MAP_FAILED) {
            problem = strerror(errno);
        } else {
            R.base = p;
            /* magic 0: we created it, or its creator died before finishing; both under the lock. */
            if (__atomic_load_n(&hdr()->magic, __ATOMIC_ACQUIRE) == 0) fill_header();
            if (!header_matches()) problem = "the file has an unknown layout (magic or version differ)";
        }
    }
    unlock_byte(0);
    if (!problem && (R.slot = claim_slot()) < 0) problem = "all process slots are in use";
    if (problem) {
        dl_warn("cannot use the shared region %s: %s; limits apply to this process only", R.path, problem);
        close_shared();
        return -1;
    }
    dl_debug("using shared region %s, slot %d", R.path, R.slot);
    return 0;
}

static void open_private(void) {
    void *p = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        /* Practically unreachable; a static region keeps the wrappers working. */
        static char fallback[REGION_BYTES] __attribute__((aligned(64)));
        memset(fallback, 0, sizeof fallback);
        p = fallback;
    }
    R.base = p;
    R.fd = -1;
    R.slot = 0;
    fill_header();
    atomic_store(&slot_at(0)->in_use, 1);
}

void dl_region_open(const char *dir) {
    if (dir && dir[0] && open_shared(dir) == 0) return;
    if (!dir || !dir[0])
        dl_debug("DRAGPU_LIMITER_STATE_DIR is not set: limits apply to this process only");
    open_private();
}

bool dl_region_is_shared(void) { return R.fd >= 0; }

void dl_region_reset_after_fork(void) {
    /* The child must not keep the parent's lock (it would keep the parent's slot alive) nor its
     * counters: it re-opens the region and claims its own slot on its next limited call. */
    if (R.fd >= 0) {
        close(R.fd);
        munmap(R.base, REGION_BYTES);
    } else if (R.base) {
        munmap(R.base, REGION_BYTES);
    }
    R.base = NULL;
    R.fd = -1;
    pthread_mutex_init(&proc_mu, NULL);
}

static int find_device(const char *uuid) {
    for (int i = 0; i < DL_MAX_DEVICES; i++) {
        struct region_dev *d = &hdr()->devs[i];
        if (atomic_load_explicit(&d->ready, memory_order_acquire) && strcmp(d->uuid, uuid) == 0) return i;
    }
    return -1;
}

int dl_region_device(const char *uuid) {
    int idx = find_device(uuid);
    if (idx >= 0) return idx;
    pthread_mutex_lock(&proc_mu);
    if (R.fd >= 0 && lock_byte(0, F_WRLCK, 1) != 0) {
        pthread_mutex_unlock(&proc_mu);
        return -1;
    }
    idx = find_device(uuid);
    for (int i = 0; idx < 0 && i < DL_MAX_DEVICES; i++) {
        struct region_dev *d = &hdr()->devs[i];
        if (!atomic_load(&d->ready)) {
            snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
            atomic_store_explicit(&d->ready, 1, memory_order_release);
            idx = i;
        }
    }
    if (R.fd >= 0) unlock_byte(0);
    pthread_mutex_unlock(&proc_mu);
    if (idx < 0) dl_warn("the region's device table is full; %s is not accounted", uuid);
    return idx;
}

/* Returns the bytes of dead processes to the totals. Only ever takes non-blocking file locks. */
static void sweep(void) {
    if (R.fd < 0) return;
    pthread_mutex_lock(&proc_mu);
    for (int i = 0; i < REGION_SLOTS; i++) {
        if (i == R.slot || !atomic_load(&slot_at(i)->in_use)) continue;
        if (lock_byte(1 + i, F_WRLCK, 0) != 0) continue;  /* owner alive */
        reclaim(i);
        atomic_store(&slot_at(i)->in_use, 0);
        unlock_byte(1 + i);
        dl_debug("returned the memory of an exited process (slot %d)", i);
    }
    pthread_mutex_unlock(&proc_mu);
}

int dl_region_reserve(int dev, uint64_t bytes, uint64_t limit) {
    if ((int64_t)bytes < 0 || bytes > (uint64_t)INT64_MAX / 4) return limit == DL_NO_LIMIT ? 1 : -1;
    struct region_dev *d = &hdr()->devs[dev];
    for (int attempt = 0; attempt < 2; attempt++) {
        int64_t cur = atomic_load_explicit(&d->used, memory_order_relaxed);
        for (;;) {
            uint64_t in_use = cur > 0 ? (uint64_t)cur : 0;
            if (limit != DL_NO_LIMIT && (bytes > limit || in_use > limit - bytes)) break;
            if (atomic_compare_exchange_weak(&d->used, &cur, cur + (int64_t)bytes)) {
                atomic_fetch_add_explicit(&slot_at(R.slot)->used[dev], (int64_t)bytes, memory_order_relaxed);
                return 0;
            }
        }
        if (attempt == 0) sweep();
    }
    atomic_fetch_add_explicit(&hdr()->stats[dev].refused, 1, memory_order_relaxed);
    return -1;
}

void dl_region_release(int dev, uint64_t bytes) {
    atomic_fetch_sub_explicit(&slot_at(R.slot)->used[dev], (int64_t)bytes, memory_order_relaxed);
    atomic_fetch_sub(&hdr()->devs[dev].used, (int64_t)bytes);
}

uint64_t dl_region_used(int dev) {
    sweep();
    int64_t v = atomic_load(&hdr()->devs[dev].used);
    return v > 0 ? (uint64_t)v : 0;
}

_Atomic int64_t *dl_region_tat(int dev) { return &hdr()->devs[dev].tat_ns; }

void dl_region_add_throttled(int dev, int64_t ns) {
    if (ns > 0) atomic_fetch_add_explicit(&hdr()->stats[dev].throttled_ns, (uint64_t)ns, memory_order_relaxed);
}

void dl_region_add_busy(int dev, int64_t ns) {
    if (ns > 0) atomic_fetch_add_explicit(&hdr()->stats[dev].busy_ns, (uint64_t)ns, memory_order_relaxed);
}
