/*
 * The environment contract's parser: table-driven cases (values, precedence, and the warning a user sees
 * for each malformed variable), then a differential fuzz test: random and mutated inputs are parsed by
 * the limiter and by an independent reference implementation written here, which must agree; random
 * environments must never crash the loader, and every warning names its variable. The claims' limits
 * files (limits.c): accepted and refused examples with the reason a user sees, then random and mutated
 * files, which must never crash the parser and are either accepted whole or refused with a line number.
 * Run under AddressSanitizer + UndefinedBehaviorSanitizer by `make test`.
 *
 * usage: t_env_fuzz [iterations] [seed]
 */
#include "check.h"

#include "config.h"
#include "claim_limits.h"
#include "log.h"

/* ---- captured log lines ---- */
static char lines[64][1024];
static int n_lines;
static void capture(int level, const char *line) {
    (void)level;
    if (n_lines < 64) snprintf(lines[n_lines++], sizeof lines[0], "%s", line);
}
static int logged(const char *needle) {
    for (int i = 0; i < n_lines; i++)
        if (strstr(lines[i], needle)) return 1;
    return 0;
}
static void load(struct dl_config *cfg, const char *const *env) {
    n_lines = 0;
    dl_config_load(cfg, (char *const *)env);
}

/* ---- reference parsers (independent of src/config.c) ---- */
static int ref_space(char c) { return c == ' ' || c == '\t'; }

static int ref_bytes(const char *s, uint64_t *out) {
    size_t i = 0, n = strlen(s);
    while (i < n && ref_space(s[i])) i++;
    size_t d0 = i;
    unsigned __int128 v = 0;
    int big = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        v = v * 10 + (unsigned)(s[i] - '0');
        if (v > ((unsigned __int128)1 << 100)) big = 1, v = (unsigned __int128)1 << 100;
        i++;
    }
    if (i == d0) return -1;
    static const char units[] = "KMGT";
    if (i + 1 < n && s[i + 1] == 'i') {
        const char *u = strchr(units, s[i]);
        if (!u || !s[i]) return -1;
        v <<= 10 * (int)(u - units + 1);
        i += 2;
    }
    while (i < n && ref_space(s[i])) i++;
    if (i != n || big || v > UINT64_MAX) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int ref_percent(const char *s, int *out) {
    uint64_t v;
    if (ref_bytes(s, &v) != 0 || strpbrk(s, "KMGTi") || v < 1 || v > 100) return -1;
    *out = (int)v;
    return 0;
}

/* ---- table-driven cases ---- */
static void unit_cases(void) {
    static const struct {
        const char *in;
        int ok;
        uint64_t v;
    } bytes[] = {
        {"512Mi", 1, 512ull << 20},
        {"1Gi", 1, 1ull << 30},
        {"10", 1, 10},
        {" 7 ", 1, 7},
        {"0", 1, 0},
        {"3Ti", 1, 3ull << 40},
        {"64Ki", 1, 65536},
        {"18446744073709551615", 1, UINT64_MAX},
        {"16777215Ti", 1, 16777215ull << 40},
        {"1G", 0, 0},
        {"1.5Gi", 0, 0},
        {"-1", 0, 0},
        {"", 0, 0},
        {"Gi", 0, 0},
        {"1 Gi", 0, 0},
        {"1gi", 0, 0},
        {"1GiB", 0, 0},
        {"0x10", 0, 0},
        {"18446744073709551616", 0, 0},
        {"16777216Ti", 0, 0},
        {"99999999999999999999999", 0, 0},
    };
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        uint64_t v = 12345;
        int r = dl_parse_bytes(bytes[i].in, &v);
        CHECK((r == 0) == bytes[i].ok, "dl_parse_bytes(\"%s\") -> %d", bytes[i].in, r);
        if (bytes[i].ok) CHECK(v == bytes[i].v, "dl_parse_bytes(\"%s\") = %llu", bytes[i].in, (unsigned long long)v);
    }
    static const struct {
        const char *in;
        int v; /* 0: rejected */
    } pct[] = {{"30", 30}, {"1", 1}, {"100", 100}, {" 50", 50},         {"0", 0}, {"101", 0}, {"30%", 0},
               {"3.5", 0}, {"", 0},  {"-5", 0},    {"1000000000000", 0}};
    for (size_t i = 0; i < sizeof pct / sizeof pct[0]; i++) {
        int v = -1;
        int r = dl_parse_percent(pct[i].in, &v);
        CHECK((r == 0) == (pct[i].v != 0), "dl_parse_percent(\"%s\") -> %d", pct[i].in, r);
        if (pct[i].v) CHECK(v == pct[i].v, "dl_parse_percent(\"%s\") = %d", pct[i].in, v);
    }

    struct dl_config cfg;
    const char *u0 = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000", *u1 = "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000001";
    char by_uuid[256];
    snprintf(by_uuid, sizeof by_uuid, "DRAGPU_MEMORY_LIMIT_BY_UUID=%s=3Gi, %s=4Gi", u0, u1);
    const char *good[] = {"DRAGPU_MEMORY_LIMIT=1Gi",
                          "DRAGPU_MEMORY_LIMIT_1=2Gi",
                          by_uuid,
                          "DRAGPU_CORES_LIMIT=30",
                          "DRAGPU_LIMITER_STATE_DIR=/var/run/claim",
                          "DRAGPU_LOG_LEVEL=warn",
                          "PATH=/bin",
                          NULL};
    load(&cfg, good);
    CHECK(n_lines == 0, "a valid environment logged: %s", lines[0]);
    CHECK(cfg.cores == 30 && strcmp(cfg.state_dir, "/var/run/claim") == 0, "cores %d dir %s", cfg.cores, cfg.state_dir);
    CHECK_EQ_U64(dl_config_limit(&cfg, 0, NULL), 1ull << 30); /* UUID unknown: global */
    CHECK_EQ_U64(dl_config_limit(&cfg, 1, NULL), 2ull << 30); /* UUID unknown: by ordinal */
    CHECK_EQ_U64(dl_config_limit(&cfg, 1, u1), 4ull << 30);   /* by UUID wins */
    /* The by-UUID list is complete: a GPU it does not name is not capped by an ordinal or global limit,
     * even when its ordinal (relative to what this container sees) has one. */
    CHECK_EQ_U64(dl_config_limit(&cfg, 1, "GPU-other"), DL_NO_LIMIT);
    CHECK_EQ_U64(dl_config_limit(&cfg, 0, "GPU-other"), DL_NO_LIMIT);
    CHECK_EQ_U64(dl_config_limit(&cfg, 5, "gpu-4A5C1E2D-7B3F-4E11-9A60-000000000000"), 3ull << 30);
    /* A MIG instance: NVML prints "MIG-<uuid>", CUDA reports the same UUID's bytes (formatted "GPU-"). */
    const char *mig[] = {"DRAGPU_MEMORY_LIMIT=1Gi",
                         "DRAGPU_MEMORY_LIMIT_BY_UUID=MIG-1b2c3d4e-0000-4e11-9a60-0000000000aa=5Gi", NULL};
    load(&cfg, mig);
    CHECK(n_lines == 0, "a MIG UUID limit logged: %s", lines[0]);
    CHECK_EQ_U64(dl_config_limit(&cfg, 0, "GPU-1b2c3d4e-0000-4e11-9a60-0000000000aa"), 5ull << 30);
    CHECK_EQ_U64(dl_config_limit(&cfg, 0, "MIG-1B2C3D4E-0000-4E11-9A60-0000000000AA"), 5ull << 30);
    CHECK_EQ_U64(dl_config_limit(&cfg, 0, "GPU-1b2c3d4e-0000-4e11-9a60-0000000000ab"),
                 DL_NO_LIMIT); /* not in the complete list */
    const char *none[] = {NULL};
    load(&cfg, none);
    CHECK(dl_config_limit(&cfg, 0, u0) == DL_NO_LIMIT && cfg.cores == 100 && !dl_config_has_any_limit(&cfg),
          "empty environment should mean no limits");

    /* Malformed values: a warning naming the variable and the value, and the value is ignored. */
    static const struct {
        const char *entry, *message;
    } bad[] = {
        {"DRAGPU_MEMORY_LIMIT=12XB", "ignoring malformed DRAGPU_MEMORY_LIMIT=\"12XB\" (expected bytes"},
        {"DRAGPU_CORES_LIMIT=150", "ignoring malformed DRAGPU_CORES_LIMIT=\"150\" (expected an integer percentage"},
        {"DRAGPU_CORES_LIMIT=0", "ignoring malformed DRAGPU_CORES_LIMIT=\"0\""},
        {"DRAGPU_LOG_LEVEL=loud", "ignoring malformed DRAGPU_LOG_LEVEL=\"loud\" (expected error, warn, info or debug)"},
        {"DRAGPU_MEMORY_LIMIT_BY_UUID=GPU-1=5", "ignoring malformed DRAGPU_MEMORY_LIMIT_BY_UUID=\"GPU-1=5\""},
        {"DRAGPU_MEMORY_LIMIT_BY_UUID=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000=1Gi,GPU-4a5c1e2d-7b3f-4e11-9a60-"
         "00000000000=1Gi",
         "ignoring malformed DRAGPU_MEMORY_LIMIT_BY_UUID=\"GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000=1Gi,GPU-"},
        {"DRAGPU_MEMORY_LIMIT_BY_UUID=nonsense", "ignoring malformed DRAGPU_MEMORY_LIMIT_BY_UUID=\"nonsense\""},
        {"DRAGPU_MEMORY_LIMIT_2=lots", "ignoring malformed DRAGPU_MEMORY_LIMIT_2=\"lots\""},
        {"DRAGPU_MEMORY_LIMIT_16=1Gi",
         "ignoring DRAGPU_MEMORY_LIMIT_16: the suffix must be a CUDA device ordinal 0..15"},
        {"DRAGPU_MEMORY_LIMIT_X=1Gi", "ignoring DRAGPU_MEMORY_LIMIT_X: the suffix must be a CUDA device ordinal"},
        {"DRAGPU_LIMITER_STATE_DIR=claims/abc",
         "ignoring malformed DRAGPU_LIMITER_STATE_DIR=\"claims/abc\" (expected an absolute"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *env[] = {bad[i].entry, NULL};
        load(&cfg, env);
        CHECK(logged(bad[i].message), "%s: expected the warning '%s', got '%s'", bad[i].entry, bad[i].message,
              n_lines ? lines[0] : "(nothing)");
        CHECK(strncmp(lines[0], "dragpu-limiter: warn: ", 22) == 0, "prefix: %s", lines[0]);
        CHECK(!dl_config_has_any_limit(&cfg) && cfg.cores == 100 && cfg.state_dir[0] == '\0', "%s was not ignored",
              bad[i].entry);
    }
    /* A malformed log level warns at the default level; a valid quieter one silences later warnings. */
    const char *quiet[] = {"DRAGPU_LOG_LEVEL=error", "DRAGPU_CORES_LIMIT=abc", NULL};
    load(&cfg, quiet);
    CHECK(n_lines == 0, "log level error should silence warnings: %s", lines[0]);
    dl_log_level = DL_LOG_WARN;
}

static uint64_t rng;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* ---- limits files ---- */
#define LF_HEAD "version=1\nclaim=ns/train\nstate=/run/dra-gpu/claims/u1/limiter\n"
#define LF_GPU0 "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000"
#define LF_GPU1 "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000001"

static void limits_cases(void) {
    struct dl_claim c;
    char why[300];
    const char *ok = "# by the node agent\n\n" LF_HEAD "device=" LF_GPU0 " memory=1073741824 cores=30\n"
                     "  device=" LF_GPU1 "\tmemory=unlimited cores=100  \n";
    CHECK(dl_parse_limits(ok, strlen(ok), &c, why, sizeof why) == 0, "valid file refused: %s", why);
    CHECK(strcmp(c.name, "ns/train") == 0 && strcmp(c.state_dir, "/run/dra-gpu/claims/u1/limiter") == 0, "%s %s",
          c.name, c.state_dir);
    CHECK(c.n_devices == 2 && c.devices[0].memory == 1073741824ull && c.devices[0].cores == 30 &&
              c.devices[1].memory == DL_NO_LIMIT && c.devices[1].cores == 100,
          "devices parsed wrong");
    /* Elastic compute: the ceiling defaults to the floor, the class to standard; both are per device. */
    CHECK(c.devices[0].ceiling == 30 && c.devices[0].priority == DL_PRIORITY_STANDARD && c.devices[1].ceiling == 100,
          "defaults of limit= and priority= wrong");
    const char *elastic = LF_HEAD "device=" LF_GPU0 " memory=1 cores=30 limit=100 priority=latency\n"
                                  "device=" LF_GPU1 " memory=1 priority=besteffort cores=10 limit=10\n";
    CHECK(dl_parse_limits(elastic, strlen(elastic), &c, why, sizeof why) == 0, "elastic file refused: %s", why);
    CHECK(c.devices[0].cores == 30 && c.devices[0].ceiling == 100 && c.devices[0].priority == DL_PRIORITY_LATENCY &&
              c.devices[1].cores == 10 && c.devices[1].ceiling == 10 && c.devices[1].priority == DL_PRIORITY_BESTEFFORT,
          "limit= and priority= parsed wrong");
    static const struct {
        const char *text, *why;
    } bad[] = {
        {LF_HEAD "device=" LF_GPU0 " memory=1Gi cores=30\n", "line 4: memory=1Gi is not a byte count"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=0\n", "line 4: cores=0 is not an integer percentage 1..100"},
        {LF_HEAD "device=" LF_GPU0 " memory=1\n", "line 4: a device line needs"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=5 colour=red\n", "line 4: unknown or repeated field 'colour=red'"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 memory=2 cores=5\n", "line 4: unknown or repeated field 'memory=2'"},
        {LF_HEAD "device=GPU-1 memory=1 cores=5\n", "line 4: device=GPU-1 is not a GPU or MIG UUID"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=5\ndevice=" LF_GPU0 " memory=1 cores=5\n", "line 5: device"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 limit=40\n", "line 4: limit= is below cores="},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 limit=101\n", "line 4: limit=101 is not an integer percentage"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 limit=\n", "line 4: limit= is not an integer percentage"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 priority=urgent\n",
         "line 4: priority=urgent is not latency, standard or besteffort"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 priority=latency priority=latency\n",
         "line 4: unknown or repeated field 'priority=latency'"},
        {LF_HEAD "device=" LF_GPU0 " memory=1 cores=50 limit=60 limit=70\n",
         "line 4: unknown or repeated field 'limit=70'"},
        {LF_HEAD "colour=blue\n", "line 4: unknown or repeated key 'colour'"},
        {LF_HEAD "version=1\n", "line 4: unknown or repeated key 'version'"},
        {LF_HEAD "nonsense\n", "line 4: 'nonsense' is not key=value"},
        {"version=2\n", "line 1: unsupported version 2"},
        {"claim=ns/train\nstate=/x\n", "no version= line"},
        {"version=1\nstate=/x\n", "no claim= line"},
        {"version=1\nclaim=ns/train\n", "no state= line"},
        {"version=1\nclaim=train\n", "line 2: claim=train is not <namespace>/<name>"},
        {"version=1\nclaim=ns/train\nstate=relative\n", "line 3: state=relative is not an absolute path"},
        {"version=1\x01\n", "line 1: control character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        CHECK(dl_parse_limits(bad[i].text, strlen(bad[i].text), &c, why, sizeof why) != 0, "accepted: %s", bad[i].text);
        CHECK(strstr(why, bad[i].why), "reason for %s: expected '%s', got '%s'", bad[i].text, bad[i].why, why);
    }
    const char nul[] = "version=1\0\n";
    CHECK(dl_parse_limits(nul, sizeof nul - 1, &c, why, sizeof why) != 0 && strstr(why, "NUL"), "NUL byte: %s", why);
}

static void limits_fuzz(long iterations) {
    static const char *const pieces[] = {"version=1\n",
                                         "claim=ns/a\n",
                                         "state=/s\n",
                                         "device=" LF_GPU0,
                                         "device=" LF_GPU1,
                                         " memory=",
                                         " cores=",
                                         "unlimited",
                                         "1073741824",
                                         "30",
                                         "100",
                                         "0",
                                         "\n",
                                         "#",
                                         " ",
                                         "\t",
                                         "=",
                                         "x",
                                         "\r\n",
                                         "MIG-",
                                         "/"};
    char text[512], why[300];
    for (long it = 0; it < iterations; it++) {
        size_t len = 0;
        for (int k = (int)(rnd() % 16); k > 0; k--) {
            const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
            size_t n = strlen(p);
            if (len + n >= sizeof text) break;
            memcpy(text + len, p, n);
            len += n;
        }
        if (len && rnd() % 4 == 0) text[rnd() % len] = (char)(rnd() % 128); /* a random byte */
        struct dl_claim c;
        why[0] = '\0';
        int r = dl_parse_limits(text, len, &c, why, sizeof why);
        if (r == 0) {
            CHECK(c.name[0] && c.state_dir[0] == '/', "accepted without a claim or state: %.*s", (int)len, text);
            for (int i = 0; i < c.n_devices; i++)
                CHECK(c.devices[i].cores >= 1 && c.devices[i].cores <= 100, "cores %d", c.devices[i].cores);
        } else {
            CHECK(why[0] && strlen(why) < sizeof why, "refused without a reason: %.*s", (int)len, text);
        }
    }
}

/* ---- fuzzing ---- */

static void random_value(char *buf, size_t cap) {
    static const char *const seeds[] = {
        "512Mi",
        " 1Gi ",
        "18446744073709551615",
        "16777216Ti",
        "30",
        "100",
        "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000=1Gi",
        "GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000=2Gi,MIG-00000000-1111-2222-3333-444444444444=3Ki",
        "debug",
        "/state/dir",
        ""};
    static const char alphabet[] = "0123456789 \tKMGTi-+.,=xGPUMIabcdef/%";
    if (rnd() % 3 == 0) {
        size_t n = rnd() % (cap - 1) % 40;
        for (size_t i = 0; i < n; i++) buf[i] = alphabet[rnd() % (sizeof alphabet - 1)];
        buf[n] = '\0';
        return;
    }
    snprintf(buf, cap, "%s", seeds[rnd() % (sizeof seeds / sizeof seeds[0])]);
    for (int m = rnd() % 4; m > 0; m--) {
        size_t n = strlen(buf), at = n ? rnd() % n : 0;
        switch (rnd() % 3) {
            case 0:
                if (n) buf[at] = alphabet[rnd() % (sizeof alphabet - 1)];
                break; /* replace */
            case 1:
                if (n) memmove(buf + at, buf + at + 1, n - at);
                break; /* delete */
            default:   /* insert */
                if (n + 2 < cap) {
                    memmove(buf + at + 1, buf + at, n - at + 1);
                    buf[at] = alphabet[rnd() % (sizeof alphabet - 1)];
                }
        }
    }
}

static void fuzz(long iterations) {
    static const char *const names[] = {"DRAGPU_MEMORY_LIMIT",
                                        "DRAGPU_MEMORY_LIMIT_0",
                                        "DRAGPU_MEMORY_LIMIT_15",
                                        "DRAGPU_MEMORY_LIMIT_99",
                                        "DRAGPU_MEMORY_LIMIT_BY_UUID",
                                        "DRAGPU_CORES_LIMIT",
                                        "DRAGPU_LIMITER_STATE_DIR",
                                        "DRAGPU_LOG_LEVEL",
                                        "DRAGPU_OTHER",
                                        "HOME"};
    char buf[128], env_store[8][192];
    for (long it = 0; it < iterations; it++) {
        random_value(buf, sizeof buf);
        uint64_t a = 0, b = 0;
        int ra = dl_parse_bytes(buf, &a), rb = ref_bytes(buf, &b);
        CHECK(ra == rb && (ra != 0 || a == b), "bytes \"%s\": limiter %d/%llu, reference %d/%llu", buf, ra,
              (unsigned long long)a, rb, (unsigned long long)b);
        int pa = 0, pb = 0;
        ra = dl_parse_percent(buf, &pa);
        rb = ref_percent(buf, &pb);
        CHECK(ra == rb && (ra != 0 || pa == pb), "percent \"%s\": limiter %d/%d, reference %d/%d", buf, ra, pa, rb, pb);

        struct dl_uuid_limit lim[DL_MAX_DEVICES];
        int n = 0;
        if (dl_parse_uuid_limits(buf, lim, DL_MAX_DEVICES, &n) == 0) {
            /* Round trip: what was accepted prints back to something that parses to the same. */
            char again[DL_MAX_DEVICES * 80] = "";
            for (int i = 0; i < n; i++) {
                CHECK(strncmp(lim[i].uuid, "GPU-", 4) == 0 || strncmp(lim[i].uuid, "MIG-", 4) == 0, "uuid %s",
                      lim[i].uuid);
                size_t len = strlen(again);
                snprintf(again + len, sizeof again - len, "%s%s=%llu", i ? "," : "", lim[i].uuid,
                         (unsigned long long)lim[i].bytes);
            }
            struct dl_uuid_limit lim2[DL_MAX_DEVICES];
            int n2 = 0;
            CHECK(dl_parse_uuid_limits(again, lim2, DL_MAX_DEVICES, &n2) == 0 && n2 == n, "round trip of \"%s\"", buf);
            for (int i = 0; i < n; i++)
                CHECK(strcmp(lim[i].uuid, lim2[i].uuid) == 0 && lim[i].bytes == lim2[i].bytes, "round trip of \"%s\"",
                      buf);
        }

        /* A random environment: loads without harm; every warning names the variable it is about. */
        const char *env[9];
        int k = (int)(rnd() % 8);
        for (int i = 0; i < k; i++) {
            char value[128];
            random_value(value, sizeof value);
            snprintf(env_store[i], sizeof env_store[i], "%s=%s", names[rnd() % (sizeof names / sizeof names[0])],
                     value);
            env[i] = env_store[i];
        }
        env[k] = NULL;
        struct dl_config cfg;
        load(&cfg, env);
        dl_log_level = DL_LOG_WARN;
        CHECK(cfg.cores >= 1 && cfg.cores <= 100, "cores %d", cfg.cores);
        CHECK(cfg.n_uuid_limits >= 0 && cfg.n_uuid_limits <= DL_MAX_DEVICES, "uuid limits %d", cfg.n_uuid_limits);
        for (int i = 0; i < n_lines; i++)
            CHECK(strstr(lines[i], "DRAGPU_"), "warning without a variable: %s", lines[i]);
        for (int i = 0; i < k; i++) {
            uint64_t want;
            if (strncmp(env[i], "DRAGPU_MEMORY_LIMIT=", 20) == 0 && ref_bytes(env[i] + 20, &want) == 0) {
                int last = 1; /* a later duplicate of the variable would win */
                for (int j = i + 1; j < k; j++) last &= strncmp(env[j], "DRAGPU_MEMORY_LIMIT=", 20) != 0;
                if (last) CHECK(cfg.has_global_limit && cfg.global_limit == want, "%s not applied", env[i]);
            }
        }
    }
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 200000;
    rng = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ull;
    dl_log_hook = capture;
    unit_cases();
    limits_cases();
    fuzz(iterations);
    limits_fuzz(iterations);
    printf("t_env_fuzz: ok (%ld iterations, seed %s)\n", iterations, argc > 2 ? argv[2] : "default");
    return 0;
}
