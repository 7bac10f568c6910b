/* limits.c: the claims' limits files (CLAIMS_ROOT/<claim-uid>/limits); the limits that apply to a device. (Not
 * limits.h: that name is the C library's, and the build's -Isrc would hide it.) */
#ifndef DRAGPU_CLAIM_LIMITS_H
#define DRAGPU_CLAIM_LIMITS_H

#include "common.h"
#include "config.h"

#define DL_MAX_CLAIMS 8 /* claims with a limits file in one container */
struct dl_claim_device {
    char uuid[DL_UUID_LEN];
    uint64_t memory; /* bytes; DL_NO_LIMIT for "unlimited" */
    int cores;       /* 1..100: the floor */
    int ceiling;     /* cores..100 (limit=; default cores) */
    int priority;    /* DL_PRIORITY_* (priority=; default standard) */
};
enum { DL_PRIORITY_LATENCY = 0, DL_PRIORITY_STANDARD = 1, DL_PRIORITY_BESTEFFORT = 2 };
struct dl_claim {
    char name[320];       /* <namespace>/<name>: up to 63 + 1 + 253 (the directory name when the file is broken) */
    char state_dir[4096]; /* the claim's shared accounting directory, as the container sees it */
    char uid[129];        /* the claim's UID (up to 128 bytes): its directory's name under CLAIMS_ROOT */
    int n_devices;
    struct dl_claim_device devices[DL_MAX_DEVICES];
    bool broken; /* malformed or unreadable: its devices get no memory */
};
struct dl_claims {
    int n;
    struct dl_claim claims[DL_MAX_CLAIMS];
    bool closed_all; /* a limits file whose devices are unknown, or too many: no device gets memory */
};
extern struct dl_claims dl_claims; /* loaded by init */
/* The process's DRAGPU_* environment (loaded by init): the environment's limits, which lower the files'. */
extern struct dl_config dl_cfg;
const char *dl_claims_root(void);
/* Where the container sees the node agent's per-GPU arbitration directories (GPUS_ROOT/<gpu-uuid>/). */
const char *dl_gpus_root(void);
/* latency, standard, besteffort: DL_PRIORITY_*; -1 for anything else. */
int dl_parse_priority(const char *s);
/* Parses one limits file; 0, or -1 with a one-line reason ("line 3: ...") in why. */
int dl_parse_limits(const char *text, size_t len, struct dl_claim *out, char *why, size_t why_len);
/* Reads every root/<dir>/limits; problems are logged once and fail closed. */
void dl_claims_load(struct dl_claims *out, const char *root);
/* The claim that lists a device (and the device's index in it), or -1. */
int dl_claim_device(const struct dl_claims *claims, const char *uuid, int *index);
bool dl_limits_from_files(void);
/* A device's memory limit: its claim's, lowered by the environment (the environment alone without limits
 * files). uuid may be NULL and ordinal -1 when unknown. */
uint64_t dl_device_limit(int ordinal, const char *uuid);
/* The compute share of the process: the smallest of its claims' devices', lowered by the environment. */
int dl_effective_cores(void);
bool dl_any_limit(void);

#endif
