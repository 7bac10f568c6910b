/*
 * The claims' limits files, written by the node agent when it prepared each claim and mounted read-only
 * into the container at CLAIMS_ROOT/<claim-uid>/limits (format in README.md). They, not the process's
 * environment, are the source of a claim's limits: a process that sets DRAGPU_* can only lower them, and
 * one that points DRAGPU_LIMITER_STATE_DIR elsewhere still shares its claim's accounting.
 *
 * Only a file the agent mounted is trusted: the root of a read-only mount of its own, whose state= is its own
 * directory's (CLAIMS_ROOT/<claim-uid>/limiter, where the agent made the region and its floor). A file the container
 * wrote (its root could make CLAIMS_ROOT/000-forged/limits) lies on a writable filesystem, or on the
 * image's read-only root where it is no mount of its own; such a file fails closed as a malformed one does.
 *
 * Failing closed: a malformed or unreadable limits file is logged once and gives its claim's devices no
 * memory (every allocation on them is refused); if not even its devices can be read, every device of the
 * process gets none. Without any limits file (a process outside a claim, demos, tests) the environment
 * alone applies, as it always has.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "claim_limits.h"
#include "common.h"
#include "config.h"
#include "log.h"

#ifndef DL_CLAIMS_ROOT
#define DL_CLAIMS_ROOT "/run/dra-gpu/claims"
#endif

#define LIMITS_MAX_BYTES 65536

struct dl_claims dl_claims;
struct dl_config dl_cfg;

#ifndef DL_GPUS_ROOT
#define DL_GPUS_ROOT "/run/dra-gpu/gpus"
#endif

const char *dl_claims_root(void) { return DL_CLAIMS_ROOT; }
const char *dl_gpus_root(void) { return DL_GPUS_ROOT; }

static int fail(char *why, size_t cap, int line, const char *fmt, const char *arg) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    if (line > 0) snprintf(why, cap, "line %d: %s", line, msg);
    else snprintf(why, cap, "%s", msg);
    return -1;
}

/* Copies the next blank-separated token of *p into out (NUL-terminated); its length, 0 at the end. */
static size_t token(const char **p, char *out, size_t cap) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    size_t n = 0;
    while (s[n] && s[n] != ' ' && s[n] != '\t') n++;
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(out, s, k);
    out[k] = '\0';
    *p = s + n;
    return n;
}

static int parse_device(const char *rest, struct dl_claim *c, int line, char *why, size_t cap) {
    struct dl_claim_device d = {.memory = DL_NO_LIMIT, .cores = 0, .priority = DL_PRIORITY_STANDARD};
    int have_uuid = 0, have_memory = 0, have_priority = 0;
    char tok[128];
    const char *p = rest;
    /* The first token is the device= value itself (the caller stripped "device="). */
    size_t n = token(&p, tok, sizeof tok);
    if (n == 0 || n >= DL_UUID_LEN || !dl_uuid_valid(tok, n))
        return fail(why, cap, line, "device=%.60s is not a GPU or MIG UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                    tok);
    memcpy(d.uuid, tok, n + 1);
    have_uuid = 1;
    while ((n = token(&p, tok, sizeof tok)) > 0) {
        if (n >= sizeof tok - 1) return fail(why, cap, line, "value too long: %.60s", tok);
        if (strncmp(tok, "memory=", 7) == 0 && !have_memory) {
            have_memory = 1;
            if (strcmp(tok + 7, "unlimited") == 0) continue;
            uint64_t b;
            if (dl_parse_bytes(tok + 7, &b) != 0 || strchr(tok + 7, 'i'))
                return fail(why, cap, line, "memory=%.60s is not a byte count or 'unlimited'", tok + 7);
            d.memory = b;
        } else if (strncmp(tok, "cores=", 6) == 0 && !d.cores) {
            if (dl_parse_percent(tok + 6, &d.cores) != 0)
                return fail(why, cap, line, "cores=%.60s is not an integer percentage 1..100", tok + 6);
        } else if (strncmp(tok, "limit=", 6) == 0 && !d.ceiling) {
            if (dl_parse_percent(tok + 6, &d.ceiling) != 0)
                return fail(why, cap, line, "limit=%.60s is not an integer percentage 1..100", tok + 6);
        } else if (strncmp(tok, "priority=", 9) == 0 && !have_priority) {
            have_priority = 1;
            d.priority = dl_parse_priority(tok + 9);
            if (d.priority < 0)
                return fail(why, cap, line, "priority=%.60s is not latency, standard or besteffort", tok + 9);
        } else {
            return fail(why, cap, line,
                        "unknown or repeated field '%.60s' (expected memory=, cores=, limit=, priority=)", tok);
        }
    }
    if (!have_uuid || !have_memory || !d.cores)
        return fail(why, cap, line, "%s", "a device line needs device=<uuid> memory=<bytes>|unlimited cores=<1..100>");
    if (!d.ceiling) d.ceiling = d.cores;
    if (d.ceiling < d.cores)
        return fail(why, cap, line, "%s", "limit= is below cores= (the ceiling must be at least the floor)");
    for (int i = 0; i < c->n_devices; i++) {
        if (dl_uuid_equal(c->devices[i].uuid, d.uuid)) return fail(why, cap, line, "device %s appears twice", d.uuid);
    }
    if (c->n_devices >= DL_MAX_DEVICES) return fail(why, cap, line, "more than %s devices", "16");
    c->devices[c->n_devices++] = d;
    return 0;
}

int dl_parse_priority(const char *s) {
    return strcmp(s, "latency") == 0      ? DL_PRIORITY_LATENCY
           : strcmp(s, "standard") == 0   ? DL_PRIORITY_STANDARD
           : strcmp(s, "besteffort") == 0 ? DL_PRIORITY_BESTEFFORT
                                          : -1;
}

int dl_parse_limits(const char *text, size_t len, struct dl_claim *c, char *why, size_t cap) {
    memset(c, 0, sizeof *c);
    if (memchr(text, '\0', len)) return fail(why, cap, 0, "%s", "the file contains a NUL byte");
    int have_version = 0, have_claim = 0, have_state = 0, line = 0;
    size_t pos = 0;
    char buf[4200];
    while (pos < len) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + 1;
        line++;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
        while (n && (*s == ' ' || *s == '\t')) s++, n--;
        if (n == 0 || *s == '#') continue;
        if (n >= sizeof buf) return fail(why, cap, line, "%s", "line too long");
        memcpy(buf, s, n);
        buf[n] = '\0';
        for (size_t i = 0; i < n; i++) {
            if ((unsigned char)buf[i] < 0x20 && buf[i] != '\t') return fail(why, cap, line, "%s", "control character");
        }
        char *eq = strchr(buf, '=');
        if (!eq) return fail(why, cap, line, "'%.60s' is not key=value", buf);
        *eq = '\0';
        const char *key = buf, *value = eq + 1;
        if (strcmp(key, "version") == 0 && !have_version) {
            if (strcmp(value, "1") != 0)
                return fail(why, cap, line, "unsupported version %.20s (this library reads 1)", value);
            have_version = 1;
        } else if (strcmp(key, "claim") == 0 && !have_claim) {
            const char *slash = strchr(value, '/');
            if (!slash || slash == value || !slash[1] || strchr(slash + 1, '/') || strpbrk(value, " \t") ||
                strlen(value) >= sizeof c->name)
                return fail(why, cap, line, "claim=%.80s is not <namespace>/<name>", value);
            snprintf(c->name, sizeof c->name, "%s", value);
            have_claim = 1;
        } else if (strcmp(key, "state") == 0 && !have_state) {
            if (value[0] != '/' || strlen(value) >= sizeof c->state_dir)
                return fail(why, cap, line, "state=%.80s is not an absolute path", value);
            snprintf(c->state_dir, sizeof c->state_dir, "%s", value);
            have_state = 1;
        } else if (strcmp(key, "device") == 0) {
            if (parse_device(value, c, line, why, cap) != 0) return -1;
        } else {
            return fail(why, cap, line, "unknown or repeated key '%.40s'", key);
        }
    }
    if (!have_version) return fail(why, cap, 0, "%s", "no version= line");
    if (!have_claim) return fail(why, cap, 0, "%s", "no claim= line");
    if (!have_state) return fail(why, cap, 0, "%s", "no state= line");
    return 0;
}

/* The devices a malformed file names on lines that do parse: the claim's devices still fail closed. */
static void salvage_devices(const char *text, size_t len, struct dl_claim *c) {
    c->n_devices = 0;
    size_t pos = 0;
    while (pos < len && c->n_devices < DL_MAX_DEVICES) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + 1;
        while (n && (*s == ' ' || *s == '\t')) s++, n--;
        if (n < 7 + 40 || strncmp(s, "device=", 7) != 0) continue;
        size_t u = 0;
        while (7 + u < n && s[7 + u] != ' ' && s[7 + u] != '\t') u++;
        if (u < DL_UUID_LEN && dl_uuid_valid(s + 7, u)) {
            memcpy(c->devices[c->n_devices].uuid, s + 7, u);
            c->devices[c->n_devices].uuid[u] = '\0';
            c->devices[c->n_devices].memory = 0;
            c->devices[c->n_devices].cores = 100;
            c->n_devices++;
        }
    }
}

/* The mount a descriptor's file is on (statx's mount id; without it, the device). */
static int mount_of(int dirfd, const char *name, int flags, uint64_t *id) {
    struct statx sx;
    if (statx(dirfd, name, flags, STATX_MNT_ID, &sx) != 0) return -1;
    *id = (sx.stx_mask & STATX_MNT_ID) ? sx.stx_mnt_id : ((uint64_t)sx.stx_dev_major << 32 | sx.stx_dev_minor);
    return 0;
}

/* Whether the open limits file at path is the root of a read-only mount (the agent's bind mount). */
static bool mounted_read_only(int fd, const char *path) {
    struct statvfs sv;
    if (fstatvfs(fd, &sv) != 0 || !(sv.f_flag & ST_RDONLY)) return false;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return false;
    *slash = '\0';
    uint64_t mine, parent;
    return mount_of(fd, "", AT_EMPTY_PATH, &mine) == 0 && mount_of(AT_FDCWD, dir, 0, &parent) == 0 && mine != parent;
}

static int read_file(const char *path, char *buf, size_t cap, size_t *len, char *why, size_t why_cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) return 1;
        return fail(why, why_cap, 0, "cannot open it: %s", strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(why, why_cap, 0, "%s", "not a regular file");
    }
    if (!mounted_read_only(fd, path)) {
        close(fd);
        return fail(why, why_cap, 0, "%s",
                    "not a read-only mount of the node agent's (the container could have written it)");
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            close(fd);
            return fail(why, why_cap, 0, "cannot read it: %s", strerror(errno));
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            close(fd);
            return fail(why, why_cap, 0, "%s", "larger than 64 KiB");
        }
    }
    close(fd);
    *len = n;
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void dl_claims_load(struct dl_claims *out, const char *root) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(root);
    if (!d) {
        if (errno != ENOENT && errno != ENOTDIR) {
            dl_error("cannot list the claims' limits in %s: %s; refusing device memory", root, strerror(errno));
            out->closed_all = true;
        }
        return;
    }
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == 64) {
            dl_error("more than 64 claims in %s; refusing device memory", root);
            out->closed_all = true;
            break;
        }
        names[n] = strdup(e->d_name);
        if (names[n]) n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    static char text[LIMITS_MAX_BYTES];
    for (int i = 0; i < n; i++) {
        char path[4200], why[300];
        snprintf(path, sizeof path, "%s/%s/limits", root, names[i]);
        size_t len = 0;
        int r = read_file(path, text, sizeof text, &len, why, sizeof why);
        if (r == 1) continue; /* a directory without a limits file is no claim of ours */
        if (out->n == DL_MAX_CLAIMS) {
            dl_error("%s: more than %d claims in one container; refusing device memory", path, DL_MAX_CLAIMS);
            out->closed_all = true;
            break;
        }
        struct dl_claim *c = &out->claims[out->n];
        char own_state[4200];
        snprintf(own_state, sizeof own_state, "%s/%s/limiter", root, names[i]);
        if (r == 0 && dl_parse_limits(text, len, c, why, sizeof why) == 0) {
            if (strcmp(c->state_dir, own_state) == 0) {
                snprintf(c->uid, sizeof c->uid, "%s", names[i]);
                out->n++;
                continue;
            }
            /* Tied: a claim's file accounts only in its own directory's region (the agent's), so a file
             * mounted elsewhere cannot name another claim's region, nor a real one a region of its own. */
            snprintf(why, sizeof why, "state=%.80s is not the claim's own state directory %.120s", c->state_dir,
                     own_state);
            r = -1; /* not the agent's: its devices are not salvaged (they stay their real claim's) */
        }
        dl_error("%s: %s; refusing allocations on this claim's devices", path, why);
        memset(c, 0, sizeof *c);
        c->broken = true;
        snprintf(c->name, sizeof c->name, "%s", names[i]);
        if (r == 0) salvage_devices(text, len, c);
        if (c->n_devices == 0) out->closed_all = true;
        out->n++;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    /* A GPU in two claims of one container: the first claim (by directory name) accounts it. */
    for (int a = 0; a < out->n; a++)
        for (int i = 0; i < out->claims[a].n_devices; i++)
            for (int b = a + 1; b < out->n; b++)
                for (int j = 0; j < out->claims[b].n_devices; j++)
                    if (dl_uuid_equal(out->claims[a].devices[i].uuid, out->claims[b].devices[j].uuid))
                        dl_warn("%s is in claims %s and %s; %s accounts it", out->claims[a].devices[i].uuid,
                                out->claims[a].name, out->claims[b].name, out->claims[a].name);
}

int dl_claim_device(const struct dl_claims *cl, const char *uuid, int *index) {
    for (int c = 0; uuid && c < cl->n; c++) {
        for (int i = 0; i < cl->claims[c].n_devices; i++) {
            if (dl_uuid_equal(cl->claims[c].devices[i].uuid, uuid)) {
                if (index) *index = i;
                return c;
            }
        }
    }
    return -1;
}

bool dl_limits_from_files(void) { return dl_claims.n > 0 || dl_claims.closed_all; }

uint64_t dl_device_limit(int ordinal, const char *uuid) {
    uint64_t env = dl_config_limit(&dl_cfg, ordinal, uuid);
    if (!dl_limits_from_files()) return env;
    uint64_t file = DL_NO_LIMIT;
    int i = 0;
    int c = uuid && dl_uuid_valid(uuid, strlen(uuid)) ? dl_claim_device(&dl_claims, uuid, &i) : -2;
    if (c >= 0) file = dl_claims.claims[c].broken ? 0 : dl_claims.claims[c].devices[i].memory;
    else if (c == -2 || dl_claims.closed_all) file = 0; /* a device we cannot tell apart: no memory */
    return env < file ? env : file;
}

int dl_effective_cores(void) {
    int cores = dl_cfg.cores;
    for (int c = 0; c < dl_claims.n; c++) {
        if (dl_claims.claims[c].broken) continue;
        for (int i = 0; i < dl_claims.claims[c].n_devices; i++) {
            if (dl_claims.claims[c].devices[i].cores < cores) cores = dl_claims.claims[c].devices[i].cores;
        }
    }
    return cores;
}

bool dl_any_limit(void) { return dl_limits_from_files() || dl_config_has_any_limit(&dl_cfg); }
