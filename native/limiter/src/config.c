/*
 * The environment contract (see README.md): parsing is strict and total. Every malformed value is
 * logged with the variable's name and value and then ignored, so a typo fails open (no limit) instead
 * of crashing or silently meaning something else.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "common.h"
#include "log.h"

#define ENV_PREFIX_LIMIT "DRAGPU_MEMORY_LIMIT"
#define ENV_BY_UUID "DRAGPU_MEMORY_LIMIT_BY_UUID"
#define ENV_CORES "DRAGPU_CORES_LIMIT"
#define ENV_STATE_DIR "DRAGPU_LIMITER_STATE_DIR"

static const char *skip_space(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* Parses "<digits>[Ki|Mi|Gi|Ti]" (surrounding blanks allowed) into bytes; rejects overflow. */
int dl_parse_bytes(const char *s, uint64_t *out) {
    if (!s) return -1;
    s = skip_space(s);
    if (!isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    unsigned shift = 0;
    if (s[0] && s[1] == 'i') {
        switch (s[0]) {
            case 'K':
                shift = 10;
                break;
            case 'M':
                shift = 20;
                break;
            case 'G':
                shift = 30;
                break;
            case 'T':
                shift = 40;
                break;
            default:
                return -1;
        }
        s += 2;
    }
    if (*skip_space(s) != '\0') return -1;
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = v << shift;
    return 0;
}

/* Parses an integer percentage 1..100. */
int dl_parse_percent(const char *s, int *out) {
    if (!s) return -1;
    s = skip_space(s);
    if (!isdigit((unsigned char)*s)) return -1;
    int v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        v = v * 10 + (*s - '0');
        if (v > 100) return -1;
    }
    if (*skip_space(s) != '\0' || v < 1) return -1;
    *out = v;
    return 0;
}

/* A GPU or MIG UUID as NVML prints it: "GPU-" or "MIG-", then 8-4-4-4-12 hex digits. */
bool dl_uuid_valid(const char *s, size_t len) {
    static const char shape[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    if (len != 4 + sizeof shape - 1) return 0;
    if (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0) return 0;
    for (size_t i = 0; i < sizeof shape - 1; i++) {
        char c = s[4 + i];
        if (shape[i] == '-' ? c != '-' : !isxdigit((unsigned char)c)) return 0;
    }
    return 1;
}

/* Parses "GPU-<uuid>=<bytes>[,GPU-<uuid>=<bytes>...]"; all-or-nothing. */
int dl_parse_uuid_limits(const char *s, struct dl_uuid_limit *out, int max, int *n) {
    if (!s) return -1;
    int count = 0;
    const char *p = s;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq || count >= max) return -1;
        const char *u = skip_space(p);
        size_t ulen = (size_t)(eq - u);
        while (ulen > 0 && (u[ulen - 1] == ' ' || u[ulen - 1] == '\t')) ulen--;
        if (!dl_uuid_valid(u, ulen)) return -1;
        char value[64];
        size_t vlen = len - (size_t)(eq + 1 - p);
        if (vlen >= sizeof value) return -1;
        memcpy(value, eq + 1, vlen);
        value[vlen] = '\0';
        uint64_t bytes;
        if (dl_parse_bytes(value, &bytes) != 0) return -1;
        memcpy(out[count].uuid, u, ulen);
        out[count].uuid[ulen] = '\0';
        out[count].bytes = bytes;
        count++;
        if (!end) break;
        p = end + 1;
    }
    *n = count;
    return 0;
}

static void malformed(const char *name, const char *value, const char *expected) {
    dl_warn("ignoring malformed %s=\"%.200s\" (expected %s)", name, value, expected);
}

void dl_config_load(struct dl_config *cfg, char *const *envp) {
    memset(cfg, 0, sizeof *cfg);
    cfg->cores = 100;
    cfg->log_level = DL_LOG_WARN;
    if (!envp) return;

    /* The log level first (log.c's spelling and parsing), so that the warnings about the other variables obey it. */
    const char *level = dl_log_level_setting(envp);
    if (level) {
        if (dl_parse_log_level(level, &cfg->log_level) != 0) {
            cfg->log_level = DL_LOG_WARN;
            dl_log_level = cfg->log_level;
            malformed(DL_ENV_LOG_LEVEL, level, "error, warn, info or debug");
        }
        dl_log_level = cfg->log_level;
    }

    for (char *const *e = envp; *e; e++) {
        const char *entry = *e;
        const char *eq = strchr(entry, '=');
        if (!eq || strncmp(entry, "DRAGPU_", 7) != 0) continue;
        size_t nlen = (size_t)(eq - entry);
        const char *v = eq + 1;
        char name[128];
        if (nlen >= sizeof name) {
            dl_warn("ignoring unknown variable %.100s...", entry);
            continue;
        }
        memcpy(name, entry, nlen);
        name[nlen] = '\0';

        if (strcmp(name, DL_ENV_LOG_LEVEL) == 0) continue;
        if (strcmp(name, ENV_PREFIX_LIMIT) == 0) {
            uint64_t b;
            if (dl_parse_bytes(v, &b) == 0) {
                cfg->has_global_limit = true;
                cfg->global_limit = b;
            } else {
                malformed(name, v, "bytes, optionally with a Ki, Mi, Gi or Ti suffix");
            }
        } else if (strcmp(name, ENV_BY_UUID) == 0) {
            struct dl_uuid_limit tmp[DL_MAX_DEVICES];
            int n = 0;
            if (dl_parse_uuid_limits(v, tmp, DL_MAX_DEVICES, &n) == 0) {
                memcpy(cfg->uuid_limits, tmp, sizeof tmp);
                cfg->n_uuid_limits = n;
            } else {
                malformed(name, v, "GPU-<uuid>=<bytes>[,GPU-<uuid>=<bytes>...], at most 16 entries");
            }
        } else if (strncmp(name, ENV_PREFIX_LIMIT "_", sizeof ENV_PREFIX_LIMIT) == 0) {
            const char *idx = name + sizeof ENV_PREFIX_LIMIT;
            int ordinal = 0, ok = *idx != '\0' && strlen(idx) <= 3;
            for (const char *c = idx; ok && *c; c++) {
                if (!isdigit((unsigned char)*c)) ok = 0;
                else ordinal = ordinal * 10 + (*c - '0');
            }
            if (!ok || ordinal >= DL_MAX_DEVICES) {
                dl_warn("ignoring %s: the suffix must be a CUDA device ordinal 0..%d", name, DL_MAX_DEVICES - 1);
                continue;
            }
            uint64_t b;
            if (dl_parse_bytes(v, &b) == 0) {
                cfg->has_ordinal_limit[ordinal] = true;
                cfg->ordinal_limit[ordinal] = b;
            } else {
                malformed(name, v, "bytes, optionally with a Ki, Mi, Gi or Ti suffix");
            }
        } else if (strcmp(name, ENV_CORES) == 0) {
            int pct;
            if (dl_parse_percent(v, &pct) == 0) cfg->cores = pct;
            else malformed(name, v, "an integer percentage 1..100");
        } else if (strcmp(name, ENV_STATE_DIR) == 0) {
            if (v[0] == '/' && strlen(v) < sizeof cfg->state_dir) {
                strcpy(cfg->state_dir, v);
            } else {
                malformed(name, v, "an absolute directory path");
            }
        }
        /* Other DRAGPU_* variables belong to other components (the plugin's own settings). */
    }
}

static bool uuid_prefixed(const char *u) { return strncasecmp(u, "GPU-", 4) == 0 || strncasecmp(u, "MIG-", 4) == 0; }

bool dl_uuid_equal(const char *a, const char *b) {
    if (uuid_prefixed(a) && uuid_prefixed(b)) a += 4, b += 4;
    return strcasecmp(a, b) == 0;
}

bool dl_config_has_uuid_limit(const struct dl_config *cfg, const char *uuid) {
    for (int i = 0; uuid && i < cfg->n_uuid_limits; i++) {
        if (dl_uuid_equal(cfg->uuid_limits[i].uuid, uuid)) return true;
    }
    return false;
}

/*
 * DRAGPU_MEMORY_LIMIT_BY_UUID, when set, is the complete list for every device whose UUID is known: a
 * device it does not name is not limited by an ordinal or global limit. Ordinals are relative to what a
 * container sees, so in a container that uses only some of a claim's GPUs, ordinal N can be a GPU the
 * limit was never meant for; the UUID cannot.
 */
uint64_t dl_config_limit(const struct dl_config *cfg, int ordinal, const char *uuid) {
    if (uuid && cfg->n_uuid_limits > 0) {
        for (int i = 0; i < cfg->n_uuid_limits; i++) {
            if (dl_uuid_equal(cfg->uuid_limits[i].uuid, uuid)) return cfg->uuid_limits[i].bytes;
        }
        return DL_NO_LIMIT;
    }
    if (ordinal >= 0 && ordinal < DL_MAX_DEVICES && cfg->has_ordinal_limit[ordinal]) return cfg->ordinal_limit[ordinal];
    if (cfg->has_global_limit) return cfg->global_limit;
    return DL_NO_LIMIT;
}

bool dl_config_has_ordinal_limits(const struct dl_config *cfg) {
    for (int i = 0; i < DL_MAX_DEVICES; i++) {
        if (cfg->has_ordinal_limit[i]) return true;
    }
    return false;
}

bool dl_config_has_any_limit(const struct dl_config *cfg) {
    return cfg->has_global_limit || cfg->n_uuid_limits > 0 || dl_config_has_ordinal_limits(cfg);
}
