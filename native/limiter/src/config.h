/* config.c: parsing of the DRAGPU_* environment (pure functions, fuzzed by tests/t_env_fuzz.c). */
#ifndef DRAGPU_CONFIG_H
#define DRAGPU_CONFIG_H

#include "common.h"
#include "log.h" /* dl_parse_log_level */

struct dl_uuid_limit {
    char uuid[DL_UUID_LEN];
    uint64_t bytes;
};

struct dl_config {
    bool has_global_limit;
    uint64_t global_limit;
    bool has_ordinal_limit[DL_MAX_DEVICES];
    uint64_t ordinal_limit[DL_MAX_DEVICES];
    int n_uuid_limits;
    struct dl_uuid_limit uuid_limits[DL_MAX_DEVICES];
    int cores;            /* 1..100; 100 means unthrottled */
    char state_dir[4096]; /* empty: no shared region, limits apply per process */
    int log_level;
};

int dl_parse_bytes(const char *s, uint64_t *out);
int dl_parse_percent(const char *s, int *out);
int dl_parse_uuid_limits(const char *s, struct dl_uuid_limit *out, int max, int *n);
/* Reads DRAGPU_* from envp (the process environment in production); malformed values are logged and
 * ignored. */
void dl_config_load(struct dl_config *cfg, char *const *envp);
/* The byte limit for a device: by UUID, else by ordinal, else global; DL_NO_LIMIT when none applies.
 * uuid may be NULL and ordinal may be -1 when unknown. */
uint64_t dl_config_limit(const struct dl_config *cfg, int ordinal, const char *uuid);
bool dl_config_has_any_limit(const struct dl_config *cfg);
bool dl_config_has_uuid_limit(const struct dl_config *cfg, const char *uuid);
/* Whether two UUIDs name the same device: case-insensitive, and "GPU-" and "MIG-" are the same prefix (CUDA
 * reports a MIG instance's UUID as plain bytes, NVML prints it "MIG-..."). */
bool dl_uuid_equal(const char *a, const char *b);
bool dl_config_has_ordinal_limits(const struct dl_config *cfg);
/* "GPU-" or "MIG-" and 8-4-4-4-12 hex digits, exactly len characters. */
bool dl_uuid_valid(const char *s, size_t len);

#endif
