/* region.c: the claim's shared accounting region (one mapped file, one slot per process). */
#ifndef DRAGPU_REGION_H
#define DRAGPU_REGION_H

#include "common.h"

/* Opens the environment's region in dir (NULL or failure: a private one) and every claim's region
 * (failure: closed, refusing limited allocations). */
void dl_region_open(const char *dir);
void dl_region_reset_after_fork(void);
/* The device handle for a GPU UUID (its claim's region, the entry created on first use). Never fails:
 * a device that cannot be accounted gets a handle that refuses every limited allocation. */
int dl_region_device(const char *uuid);
/* Charges bytes to this process unless the claim's usage would exceed limit; 0 on success. Sweeps the
 * slots of dead processes once before refusing. */
int dl_region_reserve(int dev, uint64_t bytes, uint64_t limit);
void dl_region_release(int dev, uint64_t bytes);
/* Claim-wide usage of a device (after sweeping dead processes' slots). */
uint64_t dl_region_used(int dev);
/* Theoretical arrival time of the compute rate limiter, shared by the claim (ns, CLOCK_MONOTONIC). */
_Atomic int64_t *dl_region_tat(int dev);
/* A clock further ahead than this was written by something else: admission resets it rather than wait. */
#define DL_TAT_MAX_AHEAD_NS (3600LL * 1000000000LL)
void dl_region_tat_reset(int dev, int64_t seen, int64_t now);
/* Claim-wide counters for the node agent: time slept by the compute limiter, measured GPU time. */
void dl_region_add_throttled(int dev, int64_t ns);
void dl_region_add_busy(int dev, int64_t ns);
bool dl_region_is_shared(void);
/* Memory shared between processes of a claim (region.c explains the export table). */
#define DL_EXPORT_KEY_BYTES 64
enum { DL_EXPORT_IPC = 1, DL_EXPORT_FD = 2 };
struct dl_export_key {
    int kind;
    unsigned char key[DL_EXPORT_KEY_BYTES]; /* DL_EXPORT_IPC: the handle */
    int fd;                                 /* DL_EXPORT_FD: the descriptor, in this process */
    int32_t pid;                            /* DL_EXPORT_FD: this process, and its PID namespace */
    uint64_t pidns;
};
void dl_export_key_fd(struct dl_export_key *k, int fd);
/* Moves bytes this process charged on dev into a new entry that it holds (for DL_EXPORT_FD the descriptor is
 * kept until the hold ends, to compare importers' with). The entry, or -1 (no shared region, table full, lock not taken): the charge
 * then stays with the process. */
int dl_region_export(int dev, const struct dl_export_key *k, uint64_t bytes);
/* Adds another descriptor of the same allocation (exported again) to an entry this process exported: 0, or
 * -1 when it cannot (the caller closes it; importers of that descriptor are charged as well). */
int dl_region_export_again(int dev, int idx, int fd);
/* Joins the entry of k's memory in dev's region, charging its bytes (*bytes, when not 0, must match) to
 * this process alone, within limit; the entry with *bytes set, or -1: charge the memory as usual. */
int dl_region_join(int dev, const struct dl_export_key *k, uint64_t *bytes, uint64_t limit);
/* The largest allocation a process of the claim exports as a descriptor on dev (0: none): what an import
 * that cannot be told apart from them is charged. Read without the table's lock. */
uint64_t dl_region_exported_most(int dev);
/* Ends a hold taken by dl_region_export or dl_region_join; the last holder gives the charge back. */
void dl_region_leave(int dev, int idx, uint64_t bytes);

#endif
