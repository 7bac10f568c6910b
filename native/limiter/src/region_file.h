/* The file behind region.c: its layout, the regions this process has open, and the low-level work on them
 * (locks, slots, owners, the floor, opening and mapping). Only region.c and region_file.c include it; the
 * protocol is described at the top of region.c. */
#ifndef DRAGPU_REGION_FILE_H
#define DRAGPU_REGION_FILE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "claim_limits.h"
#include "common.h"
#include "region.h"

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

extern struct region regions[MAX_REGIONS];
/* This process's own charges per device handle: the shared counters can be rewritten by any process of
 * the claim, these cannot. */
extern _Atomic int64_t own_used[MAX_REGIONS * DL_MAX_DEVICES];
/* The floor's sample this process last saw per device handle, and its own charges then: what it charged
 * since is on top of the floor (the floor cannot hold it yet), whatever the region's counters say. */
extern _Atomic uint64_t floor_seen[MAX_REGIONS * DL_MAX_DEVICES];
extern _Atomic int64_t own_at_floor[MAX_REGIONS * DL_MAX_DEVICES];
/* This process's PID namespace and start time, as its slot records them (0: unknown). */
extern uint64_t self_pidns, self_start;

static inline struct region_header *hdr(const struct region *g) { return (struct region_header *)g->base; }
static inline struct region_slot *slot_at(const struct region *g, int i) {
    return (struct region_slot *)(g->base + SLOTS_AT) + i;
}
static inline struct region_export *export_at(const struct region *g, int i) {
    return (struct region_export *)(g->base + HEADER_BYTES) + i;
}
static inline struct region *region_of(int dev) { return &regions[dev / DL_MAX_DEVICES]; }
static inline int entry_of(int dev) { return dev % DL_MAX_DEVICES; }

/* region_file.c */
uint64_t own_pidns(void);
int lock_byte(int fd, off_t off, short type);
int lock_byte_bounded(int fd, off_t off);
int own_description(const struct region *g);
int header_matches(const struct region *g);
void mark_bad(struct region *g, const char *why);
bool owner_gone(const struct region_slot *s);
void forget_owner(struct region_slot *s);
void reclaim(struct region *g, int i);
void retire(struct region *g, struct region_export *x);
void drop_holders(struct region *g, const uint64_t gone[HOLDER_WORDS]);
void set_holder(struct region_export *x, int slot);
void unmap(struct region *g);
void open_floor(struct region *g, const char *dir);
void link_floor(struct region *g, int e, const char *uuid);
int64_t floor_read(const struct region *g, int e, int64_t *seen, uint64_t *seq);
int64_t floor_account(int dev, int64_t floor, uint64_t seq, int64_t mine);
void floor_wait(const struct region *g, uint64_t seq);
int open_shared(struct region *g, const char *dir, int log_level, bool agent_made);
void open_private(struct region *g, bool closed);

#endif
