/*
 * The fake driver's own state and its driver-wide entry points: the settings (FAKE_CUDA_*, fake_common.h), read
 * once on the first call; the simulated devices and the lock over them; fork handling; cuInit and the check
 * every entry point makes first (initialised; a current context where one is needed); the driver version;
 * error names and strings; and cuGetProcAddress(_v2), which resolves (base name, cudaVersion, flags) to the
 * exact ABI variant from the generated table of the fake's own functions (never through dlsym), with the
 * documented statuses: SYMBOL_NOT_FOUND / VERSION_NOT_SUFFICIENT with CUDA_SUCCESS and a NULL pointer, and
 * CUDA_ERROR_INVALID_VALUE for a cudaVersion newer than the driver.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_proctable.h"

struct device devices[FAKE_MAX_DEVICES];
struct fake_settings G;
pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* fork(): the child gets the device state with no lock held by a thread it does not have, as a real driver
 * answers a forked child's calls instead of hanging in them. */
static void fork_prepare(void) {
    pthread_mutex_lock(&mu); /* first: a holder of the counters' lock waits for nothing */
    fake_counters_lock();
}
static void fork_release(void) {
    fake_counters_unlock();
    pthread_mutex_unlock(&mu);
}

static void load_config(void) {
    pthread_atfork(fork_prepare, fork_release, fork_release);
    G.count = fake_device_count();
    G.memory = fake_memory_bytes();
    G.sms = fake_env_u64("FAKE_CUDA_SM_COUNT", 132);
    if (G.sms == 0) G.sms = 1;
    G.wave_ns = fake_env_u64("FAKE_CUDA_WAVE_NS", 10000);
    G.driver_version = (int)fake_env_u64("FAKE_CUDA_DRIVER_VERSION", 13000);
    G.event_create_fails = fake_env_u64("FAKE_CUDA_EVENT_CREATE_FAILS", 0) != 0;
    G.real_timing = fake_env_u64("FAKE_CUDA_REAL_TIMING", 0) != 0;
    G.neighbour_busy_ns = fake_env_u64("FAKE_CUDA_NEIGHBOUR_BUSY_US", 0) * 1000;
    G.neighbour_period_ns =
        G.neighbour_busy_ns ? G.neighbour_busy_ns + fake_env_u64("FAKE_CUDA_NEIGHBOUR_FREE_US", 0) * 1000 : 0;
    G.ctx_stack = fake_env_u64("FAKE_CUDA_CTX_STACK_BYTES", 0);
    G.ctx_heap = fake_env_u64("FAKE_CUDA_CTX_HEAP_BYTES", 0);
    G.ctx_fifo = fake_env_u64("FAKE_CUDA_CTX_FIFO_BYTES", 0);
    G.ctx_base = fake_context_bytes();
    for (int i = 0; i < FAKE_MAX_DEVICES; i++) {
        devices[i].primary = (struct CUctx_st){.magic = MAGIC_CTX, .device = i};
        devices[i].pool = (struct CUmemPoolHandle_st){MAGIC_POOL, i, 0, 0, 0};
    }
    fake_publish_start(); /* publish.c: what this process holds and runs, for the fake NVML */
}

void fake_configure(void) { pthread_once(&config_once, load_config); }

CUresult check(int need_ctx) {
    pthread_once(&config_once, load_config);
    if (!G.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (need_ctx && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- init, version, errors */

EXPORT CUresult cuInit(unsigned int flags) {
    COUNT();
    pthread_once(&config_once, load_config);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    G.initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    COUNT();
    pthread_once(&config_once, load_config);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = G.driver_version;
    return CUDA_SUCCESS;
}

static const struct error_row {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* The row of the table for `e`, or NULL for a code the driver does not know. */
static const struct error_row *error_row(CUresult e) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) return &errors[i];
    return NULL;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    COUNT();
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    const struct error_row *row = error_row(e);
    *s = row ? row->name : NULL;
    return row ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    COUNT();
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    const struct error_row *row = error_row(e);
    *s = row ? row->text : NULL;
    return row ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------------- cuGetProcAddress */

/* FAKE_CUDA_GETPROC_LOG=<file>: one line per lookup, "<name> <version> <flags> <symbol or ->". */
static FILE *getproc_log;
static void open_getproc_log(void) {
    const char *path = getenv("FAKE_CUDA_GETPROC_LOG");
    if (path && *path) getproc_log = fopen(path, "a");
}

static void log_lookup(const char *symbol, int version, cuuint64_t flags, const struct fake_proc_entry *pick) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, open_getproc_log);
    if (!getproc_log) return;
    fprintf(getproc_log, "%s %d %llu %s\n", symbol[0] ? symbol : "\"\"", version, (unsigned long long)flags,
            pick ? pick->symbol : "-");
    fflush(getproc_log);
}

static CUresult resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status) {
    pthread_once(&config_once, load_config);
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (version > G.driver_version) return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct fake_proc_entry *legacy = NULL, *ptsz = NULL;
    int known = 0;
    for (unsigned i = 0; i < fake_proc_table_len; i++) {
        const struct fake_proc_entry *e = &fake_proc_table[i];
        if (strcmp(e->base, symbol) != 0) continue;
        known = 1;
        if (e->version > version) continue;
        const struct fake_proc_entry **best = e->per_thread ? &ptsz : &legacy;
        if (!*best || e->version > (*best)->version) *best = e;
    }
    const struct fake_proc_entry *pick = per_thread && ptsz ? ptsz : legacy;
    log_lookup(symbol, version, flags, pick);
    *pfn = pick ? (void *)pick->fn : NULL;
    if (status)
        *status = pick    ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    COUNT();
    return resolve(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    COUNT();
    return resolve(symbol, pfn, version, flags, NULL);
}
