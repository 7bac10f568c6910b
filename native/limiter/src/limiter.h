/*
 * Internal interface of libdragpu-limiter: the pieces the wrappers share.
 *
 * Layout of the library:
 *   log.c      stderr logging with the "dragpu-limiter:" prefix
 *   config.c   parsing of the DRAGPU_* environment (pure functions, fuzzed by tests/t_env_fuzz.c)
 *   limits.c   the claims' limits files written by the node agent; the limits that apply to a device
 *   init.c     lazy, thread-safe initialisation on the first intercepted call; fork handling
 *   region.c   the claim's shared accounting region (one mapped file, one slot per process)
 *   driver.c   loading the real libcuda/libnvidia-ml, the dlsym and cuGetProcAddress interposers
 *   devices.c  which device a call is about: ordinal -> UUID -> region entry and limit, granularity
 *   ledger.c   what each live allocation charged (a striped table) and the charge/refund of it
 *   memory.c   the allocation wrappers and the capped memory view (CUDA side)
 *   ipc.c      memory shared within the claim: IPC handles and VMM export/import/map, charged once
 *   pools.c    memory pools and graph memory: charged what the driver reports they reserve
 *   contexts.c what contexts reserve (stack, malloc heap, printf FIFO, the context itself)
 *   dlsym.c    the dlsym interposer
 *   nvml.c     the capped memory view (NVML side)
 *   launch.c   the compute cap's launch entry points
 *   measure.c  the GPU time of throttled launches (timing events, estimates) and each launch's bookkeeping
 *   admission.c the claim's share and the GPU-time rate limiter shared by the claim's processes
 *   arbiter.c  elastic compute: a claim's share of a GPU from the agent's board and the claims' activity files
 *   capture.c  stream capture: what may be capturing, and keeping the library's calls from disturbing it
 */
#ifndef DRAGPU_LIMITER_H
#define DRAGPU_LIMITER_H

#include "cuda_min.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nvml_min.h"

/* cuda.h maps these base names to their newest variant; we name exact symbols, old ones included. */
#undef cuGetProcAddress
#undef cuEventElapsedTime
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGraphAddNode
#undef cuGraphInstantiate
#undef cuStreamBeginCapture
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle

#define DL_EXPORT __attribute__((visibility("default")))
/* For code that runs inside the sanitizer runtimes' own start-up (they resolve their interceptors
 * through our dlsym before their shadow memory exists): never instrumented, even in sanitizer builds. */
#define DL_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
#define DL_LIKELY(x) __builtin_expect(!!(x), 1)
#define DL_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define DL_MAX_DEVICES 16 /* CUDA ordinals and region device entries per process / claim */
/* contexts.c: a context is charged at most its limits' formula plus this much of what the driver took. */
#define DL_CTX_SLACK (1ull << 30)
#define DL_UUID_LEN 48 /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (40) + NUL, rounded up */
#define DL_NO_LIMIT UINT64_MAX

/* ---- log.c ---- */
enum { DL_LOG_ERROR = 0, DL_LOG_WARN = 1, DL_LOG_INFO = 2, DL_LOG_DEBUG = 3 };
extern _Atomic int dl_log_level;
/* Tests capture log lines through this hook; NULL (the default) writes them to stderr. */
extern void (*dl_log_hook)(int level, const char *line);
void dl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define dl_error(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)
#define dl_warn(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define dl_info(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define dl_debug(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)

/* ---- config.c ---- */
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
int dl_parse_log_level(const char *s, int *out);
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

/* ---- limits.c: the claims' limits files (CLAIMS_ROOT/<claim-uid>/limits) ---- */
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

/* ---- init.c ---- */
extern struct dl_config dl_cfg;
extern _Atomic int dl_core_ready; /* 1 once dl_core_init has run in this process (reset by fork) */
void dl_core_init_slow(void);
static inline void dl_core_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_core_ready, memory_order_acquire))) dl_core_init_slow();
}
void dl_uuid_format(const unsigned char bytes[16], char out[DL_UUID_LEN]);
uint64_t dl_now_ns(void);
/* A 64-bit mixer (the murmur3 finaliser) for the process-local hash tables. */
static inline uint64_t dl_hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/* ---- region.c ---- */
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

/* ---- driver.c ---- */
/* Real driver entry points: hooked ones plus the few the limiter calls itself. */
#define DL_CUDA_HOOKED(X)                                                                                              \
    X(cuGetProcAddress, PFN_cuGetProcAddress_v11030)                                                                   \
    X(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000)                                                                \
    X(cuMemAlloc_v2, PFN_cuMemAlloc_v3020)                                                                             \
    X(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020)                                                                   \
    X(cuMemAllocManaged, PFN_cuMemAllocManaged_v6000)                                                                  \
    X(cuMemFree_v2, PFN_cuMemFree_v3020)                                                                               \
    X(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)                                                                     \
    X(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz)                                                           \
    X(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)                                                     \
    X(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)                                           \
    X(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                                                                       \
    X(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz)                                                             \
    X(cuMemCreate, PFN_cuMemCreate_v10020)                                                                             \
    X(cuMemRelease, PFN_cuMemRelease_v10020)                                                                           \
    X(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)                                             \
    X(cuMemMap, PFN_cuMemMap_v10020)                                                                                   \
    X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                                                               \
    X(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020)                                       \
    X(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020)                                           \
    X(cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010)                                                                  \
    X(cuIpcOpenMemHandle, PFN_cuIpcOpenMemHandle_v4010)                                                                \
    X(cuIpcOpenMemHandle_v2, PFN_cuIpcOpenMemHandle_v11000)                                                            \
    X(cuIpcCloseMemHandle, PFN_cuIpcCloseMemHandle_v4010)                                                              \
    X(cuArrayCreate_v2, PFN_cuArrayCreate_v3020)                                                                       \
    X(cuArray3DCreate_v2, PFN_cuArray3DCreate_v3020)                                                                   \
    X(cuArrayDestroy, PFN_cuArrayDestroy_v2000)                                                                        \
    X(cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000)                                                        \
    X(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000)                                                      \
    X(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020)                                                                         \
    X(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020)                                                                 \
    X(cuMemAlloc, PFN_cuMemAlloc_v2000)                                                                                \
    X(cuMemAllocPitch, PFN_cuMemAllocPitch_v2000)                                                                      \
    X(cuMemFree, PFN_cuMemFree_v2000)                                                                                  \
    X(cuMemGetInfo, PFN_cuMemGetInfo_v2000)                                                                            \
    X(cuDeviceTotalMem, PFN_cuDeviceTotalMem_v2000)                                                                    \
    X(cuArrayCreate, PFN_cuArrayCreate_v2000)                                                                          \
    X(cuArray3DCreate, PFN_cuArray3DCreate_v2000)                                                                      \
    X(cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020)                                                                     \
    X(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)                                                         \
    X(cuMemPoolDestroy, PFN_cuMemPoolDestroy_v11020)                                                                   \
    X(cuGraphAddMemAllocNode, PFN_cuGraphAddMemAllocNode_v11040)                                                       \
    X(cuGraphAddNode, PFN_cuGraphAddNode_v12020)                                                                       \
    X(cuGraphAddNode_v2, PFN_cuGraphAddNode_v12030)                                                                    \
    X(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040)                                             \
    X(cuGraphInstantiate, PFN_cuGraphInstantiate_v10000)                                                               \
    X(cuGraphInstantiate_v2, PFN_cuGraphInstantiate_v11000)                                                            \
    X(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000)                                           \
    X(cuGraphInstantiateWithParams_ptsz, PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                 \
    X(cuGraphUpload, PFN_cuGraphUpload_v11010)                                                                         \
    X(cuGraphUpload_ptsz, PFN_cuGraphUpload_v11010_ptsz)                                                               \
    X(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000)                                                               \
    X(cuGraphDestroy, PFN_cuGraphDestroy_v10000)                                                                       \
    X(cuDeviceGraphMemTrim, PFN_cuDeviceGraphMemTrim_v11040)                                                           \
    X(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)                                                    \
    X(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000)                                              \
    X(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000)                                                  \
    X(cuCtxCreate_v2, PFN_cuCtxCreate_v3020)                                                                           \
    X(cuCtxCreate_v3, PFN_cuCtxCreate_v11040)                                                                          \
    X(cuCtxCreate_v4, PFN_cuCtxCreate_v12050)                                                                          \
    X(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000)                                                                         \
    X(cuCtxSetLimit, PFN_cuCtxSetLimit_v3010)                                                                          \
    X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                                                              \
    X(cuStreamSynchronize_ptsz, PFN_cuStreamSynchronize_v7000_ptsz)                                                    \
    X(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)                                                                    \
    X(cuCtxSynchronize_v2, PFN_cuCtxSynchronize_v13000)                                                                \
    X(cuEventSynchronize, PFN_cuEventSynchronize_v2000)                                                                \
    X(cuCtxCreate, PFN_cuCtxCreate_v2000)                                                                              \
    X(cuCtxDestroy, PFN_cuCtxDestroy_v2000)                                                                            \
    X(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v7000)                                                  \
    X(cuDevicePrimaryCtxReset, PFN_cuDevicePrimaryCtxReset_v7000)                                                      \
    X(cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                                                        \
    X(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz)                                                              \
    X(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060)                                                                   \
    X(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz)                                                         \
    X(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000)                                                  \
    X(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz)                                        \
    X(cuGraphLaunch, PFN_cuGraphLaunch_v10000)                                                                         \
    X(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz)                                                               \
    X(cuLaunch, PFN_cuLaunch_v2000)                                                                                    \
    X(cuLaunchGrid, PFN_cuLaunchGrid_v2000)                                                                            \
    X(cuLaunchGridAsync, PFN_cuLaunchGridAsync_v2000)                                                                  \
    X(cuLaunchCooperativeKernelMultiDevice, PFN_cuLaunchCooperativeKernelMultiDevice_v9000)                            \
    X(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000)                                                           \
    X(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz)                                                 \
    X(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010)                                                        \
    X(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz)                                              \
    X(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030)                                             \
    X(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz)                                   \
    X(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000)                                                               \
    X(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz)

#define DL_CUDA_USED(X)                                                                                                \
    X(cuInit, PFN_cuInit_v2000)                                                                                        \
    X(cuDeviceGet, PFN_cuDeviceGet_v2000)                                                                              \
    X(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000)                                                                    \
    X(cuDeviceGetUuid_v2, PFN_cuDeviceGetUuid_v11040)                                                                  \
    X(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000)                                                                        \
    X(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000)                                                                      \
    X(cuEventCreate, PFN_cuEventCreate_v2000)                                                                          \
    X(cuEventRecord, PFN_cuEventRecord_v2000)                                                                          \
    X(cuEventRecord_ptsz, PFN_cuEventRecord_v7000_ptsz)                                                                \
    X(cuEventQuery, PFN_cuEventQuery_v2000)                                                                            \
    X(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000)                                                                \
    X(cuEventElapsedTime_v2, PFN_cuEventElapsedTime_v12080)                                                            \
    X(cuEventDestroy_v2, PFN_cuEventDestroy_v4000)                                                                     \
    X(cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000)                                                             \
    X(cuStreamIsCapturing_ptsz, PFN_cuStreamIsCapturing_v10000_ptsz)                                                   \
    X(cuCtxGetLimit, PFN_cuCtxGetLimit_v3010)                                                                          \
    X(cuMemGetAllocationPropertiesFromHandle, PFN_cuMemGetAllocationPropertiesFromHandle_v10020)                       \
    X(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                                                            \
    X(cuStreamGetDevice, PFN_cuStreamGetDevice_v12080)                                                                 \
    X(cuStreamGetDevice_ptsz, PFN_cuStreamGetDevice_v12080_ptsz)                                                       \
    X(cuStreamGetCtx, PFN_cuStreamGetCtx_v9020)                                                                        \
    X(cuStreamGetCtx_ptsz, PFN_cuStreamGetCtx_v9020_ptsz)                                                              \
    X(cuCtxPushCurrent_v2, PFN_cuCtxPushCurrent_v4000)                                                                 \
    X(cuCtxPopCurrent_v2, PFN_cuCtxPopCurrent_v4000)                                                                   \
    X(cuThreadExchangeStreamCaptureMode, PFN_cuThreadExchangeStreamCaptureMode_v10010)                                 \
    X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020)                                         \
    X(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                                                          \
    X(cuDeviceGetMemPool, PFN_cuDeviceGetMemPool_v11020)                                                               \
    X(cuMemPoolGetAttribute, PFN_cuMemPoolGetAttribute_v11020)                                                         \
    X(cuDeviceGetGraphMemAttribute, PFN_cuDeviceGetGraphMemAttribute_v11040)

#define DL_NVML_HOOKED(X)                                                                                              \
    X(nvmlDeviceGetMemoryInfo, dl_pfn_nvmlDeviceGetMemoryInfo)                                                         \
    X(nvmlDeviceGetMemoryInfo_v2, dl_pfn_nvmlDeviceGetMemoryInfo_v2)

#define DL_NVML_USED(X)                                                                                                \
    X(nvmlDeviceGetUUID, dl_pfn_nvmlDeviceGetUUID)                                                                     \
    X(nvmlInit_v2, dl_pfn_nvmlInit_v2)                                                                                 \
    X(nvmlShutdown, dl_pfn_nvmlShutdown)                                                                               \
    X(nvmlDeviceGetHandleByUUID, dl_pfn_nvmlDeviceGetHandleByUUID)

struct dl_real_cuda {
#define DL_FIELD(name, type) type name;
    DL_CUDA_HOOKED(DL_FIELD)
    DL_CUDA_USED(DL_FIELD)
};
struct dl_real_nvml {
    DL_NVML_HOOKED(DL_FIELD)
    DL_NVML_USED(DL_FIELD)
#undef DL_FIELD
};

/* Our wrappers, exported under the driver's exact names. */
#define DL_DECLARE(name, type) DL_EXPORT extern __typeof__(*(type)0) name;
DL_CUDA_HOOKED(DL_DECLARE)
DL_NVML_HOOKED(DL_DECLARE)
#undef DL_DECLARE

/* The wrapper with exactly this exported name, or NULL if we wrap none. */
DL_NO_SANITIZE void *dl_cuda_wrapper(const char *name);
DL_NO_SANITIZE void *dl_nvml_wrapper(const char *name);
/* The C library's dlsym (never our interposer). */
typedef void *(*dl_dlsym_fn)(void *, const char *);
DL_NO_SANITIZE dl_dlsym_fn dl_real_dlsym(void);
typedef void *(*dl_dlvsym_fn)(void *, const char *, const char *);
DL_NO_SANITIZE dl_dlvsym_fn dl_real_dlvsym(void);
/* libc.c: a function of the C library, from its own symbol table; NULL without one. */
DL_NO_SANITIZE void *dl_libc_function(const char *name);

extern struct dl_real_cuda dl_cuda; /* valid after dl_cuda_init() */
extern struct dl_real_nvml dl_nvml; /* valid after dl_nvml_init() */
extern _Atomic int dl_cuda_ready, dl_nvml_ready;
void dl_cuda_init_slow(void);
void dl_nvml_init_slow(void);
void dl_driver_reset_after_fork(void);
static inline void dl_cuda_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_cuda_ready, memory_order_acquire))) dl_cuda_init_slow();
}
static inline void dl_nvml_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_nvml_ready, memory_order_acquire))) dl_nvml_init_slow();
}

/* nvml.c: NVML for what the library charges by (a context's measured size): the libnvidia-ml.so.1 beside the
 * driver this process uses, opened by its path - never one found on the library path, the tenant's to set.
 * Its entry points are NULL where there is none (then nothing is measured through NVML). */
struct dl_measure_nvml {
    dl_pfn_nvmlInit_v2 nvmlInit_v2;
    dl_pfn_nvmlShutdown nvmlShutdown;
    dl_pfn_nvmlDeviceGetHandleByUUID nvmlDeviceGetHandleByUUID;
    dl_pfn_nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo;
};
extern struct dl_measure_nvml dl_measure;
void dl_measure_nvml_init(void);

/* ---- devices.c ---- */
/* Region device index and limit for a CUDA ordinal (resolved through the UUID once per process). */
int dl_device_for_ordinal(int ordinal, uint64_t *limit);
/* The capped (total, free) view shared by the CUDA and NVML queries. */
void dl_capped_view(int dev, uint64_t limit, uint64_t real_total, uint64_t real_free, uint64_t *total,
                    uint64_t *free_bytes);
void dl_devices_reset_after_fork(void);

/* ---- ledger.c: what each live allocation charged, and the charging ---- */
void dl_memory_reset_after_fork(void);
void dl_ledger_before_fork(void);
void dl_ledger_after_fork_parent(void);
/* Records that other modules keep in the ledger's table of live allocations: a key of a kind, with a device,
 * bytes and one more value; put replaces, take removes and reports (0 if absent). */
enum {
    DL_REC_POOLPTR = 16,
    DL_REC_GRAPH = 17,
    DL_REC_EXEC = 18,
    DL_REC_CAPTURE = 19,
    DL_REC_CTX = 20,
    DL_REC_IMPORT = 21,
    DL_REC_IPC = 22
};
void dl_rec_put(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t aux);
int dl_rec_take(unsigned kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *aux);
/* The current context's CUDA ordinal, -1 without one. */
int dl_current_ordinal(void);
/* The CUDA ordinal of a stream's device (the current context's for the NULL and the legacy/per-thread
 * default streams), -1 when neither the stream nor a current context tells it. A stream that is capturing (or
 * may be: a capture is open and cuStreamIsCapturing cannot tell) is never asked - the real driver answers
 * cuStreamGetDevice on a capturing stream with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 * capture -: its ordinal is the current context's. */
int dl_stream_ordinal(CUstream s, int ptsz);
/* Charges rounded up to whole units of the device's allocation granularity. */
uint64_t dl_round_granule(int ordinal, uint64_t bytes);
/* Charges bytes, rounded up to the device's allocation granularity, to a device: CUDA_ERROR_OUT_OF_MEMORY over
 * the limit (after pools.c gave back what the driver no longer holds). An unknown device is not charged: the
 * driver will answer the call with its own error. */
struct dl_charge {
    int dev;
    uint64_t bytes;
};
CUresult dl_charge(int ordinal, uint64_t bytes, struct dl_charge *c);
void dl_refund(const struct dl_charge *c);
/* A charge kept when the driver call succeeded (remembered under key), refunded when it failed. */
void dl_settle(CUresult r, unsigned kind, uint64_t key, const struct dl_charge *c);
/* The ledger's entries: the kinds of memory.c and ipc.c. */
/* K_MAP: a mapping made by cuMemMap, keyed by its address: bytes is its size, handle what it maps (0 when
 * the handle is not one we charged). */
enum kind { K_PTR = 1, K_HANDLE = 2, K_ARRAY = 3, K_MIPMAP = 4, K_MAP = 5 }; /* DL_REC_* follow */

struct entry {
    uint64_t key; /* 0 = empty */
    uint64_t bytes;
    uint64_t handle; /* K_MAP: the handle mapped; K_PTR, K_HANDLE: the export entry + 1 (see release) */
    uint32_t refs;   /* K_HANDLE: the driver's references to the allocation that we have seen */
    int16_t dev;
    uint8_t kind;
    uint8_t tomb;
};
/* Gives a charge back: to the claim's total, or (shared != 0: the export table's entry + 1) by ending this
 * process's hold on memory shared within the claim. */
void dl_release_charge(int dev, uint64_t bytes, uint64_t shared);
/* Remembers a charge; an entry left behind for the same key (a free we did not see) is refunded. */
void dl_track_shared(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t shared);
void dl_track(unsigned kind, uint64_t key, int dev, uint64_t bytes);
/* Looks an entry up under its stripe's lock and applies op (which returns 1 to delete it); the entry as it
 * was goes to *out. Returns whether it was found. */
int dl_update(unsigned kind, uint64_t key, int (*op)(struct entry *), struct entry *out);
/* Puts an entry in (an entry of the same key and kind is replaced and copied to *old); -1 without memory. */
int dl_insert(const struct entry *e, struct entry *old);
int dl_op_delete(struct entry *e);
int dl_op_ref(struct entry *e);
int dl_op_unref(struct entry *e);
/* Forgets a charge and reports it (*shared: as for dl_release_charge); 0 bytes if the key is unknown. */
uint64_t dl_untrack(unsigned kind, uint64_t key, int *dev, uint64_t *shared);
/* A reference to a charged VMM handle (0 if it is not one we charged); dropping one returns the bytes to
 * refund when it was the last (*known: whether we charged the handle); the undo restores it. */
int dl_handle_ref(uint64_t handle);
uint64_t dl_handle_unref(uint64_t handle, int *dev, int *known, uint64_t *shared);
void dl_handle_unref_undo(uint64_t handle, int known, int dev, uint64_t bytes, uint64_t shared);

/* ---- pools.c: memory the driver keeps for the process beyond live allocations ---- */
/* Pools the process allocates from, and the graph memory pool of each device, are charged what the driver
 * reports they reserve. Gives back what the driver no longer holds on a device. */
void dl_pools_reclaim(int ordinal);
/* Whether the process has any pool or graph memory charged (then a refusal is worth a reclaim first). */
bool dl_pools_active(void);
/* A stream-ordered allocation (pool NULL: the stream's device's current pool). */
CUresult dl_ordered_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int ptsz,
                          CUresult (*call)(CUdeviceptr *, size_t, CUmemoryPool, CUstream, int));
/* Frees of pointers with no charge of their own: a pool's allocation (its pool is settled after the free)
 * or a graph's (the graph memory pools are). */
struct dl_pool_free {
    CUdeviceptr ptr;
    int known, dev;
    uint64_t bytes, pool;
};
void dl_pools_before_free(CUdeviceptr p, struct dl_pool_free *f);
void dl_pools_after_free(const struct dl_pool_free *f, CUresult r);
/* Capture bookkeeping: a capture's graph allocations move to the graph it produces. */
void dl_graphmem_capture_ended(CUstream s, CUgraph g);
/* Graph launches and uploads: the first of an executable graph with allocation nodes is charged what the
 * graph memory pool grows by. */
extern _Atomic int dl_graphmem_pending;
struct dl_graph_ticket {
    int n;
    struct dl_charge c[4];
    int ordinal[4];
    uint64_t bytes[4]; /* the graph's allocations on that device */
};
CUresult dl_graphmem_before_launch(CUgraphExec g, struct dl_graph_ticket *t);
void dl_graphmem_after_launch(CUgraphExec g, CUresult r, struct dl_graph_ticket *t);
void dl_pools_reset_after_fork(void);

/* ---- contexts.c: what contexts reserve (stack, malloc heap, printf FIFO) ---- */
void dl_contexts_reset_after_fork(void);
/* Bumped whenever a context may be gone (destroyed, reset, released): cached context facts expire. */
extern _Atomic unsigned dl_ctx_epoch;

/* ---- the compute limiter: launch.c, measure.c (measure.h), admission.c (admission.h), capture.c (capture.h) ---- */

#endif
