/*
 * The NVML side of the capped memory view: nvmlDeviceGetMemoryInfo(_v2) report the same total and free
 * as cuMemGetInfo_v2 (both come from dl_capped_view), so nvidia-smi, pynvml and frameworks that size
 * their pools from NVML see the claim's limit, not the whole GPU.
 *
 * An NVML device is identified by its UUID. Its limit is the DRAGPU_MEMORY_LIMIT_BY_UUID entry, else the
 * DRAGPU_MEMORY_LIMIT_<N> of the CUDA ordinal with that UUID, else DRAGPU_MEMORY_LIMIT. The ordinal is
 * found through the driver only if the process has initialised CUDA itself: an NVML query never calls
 * cuInit (nor loads libcuda) - initialising CUDA behind the back of, say, a Python parent that asks pynvml
 * before forking its CUDA workers would break the workers, as CUDA does not survive fork().
 *
 * What the library charges by is measured with the driver's own NVML (dl_measure): the libnvidia-ml.so.1 in
 * the directory of the libcuda.so.1 the process uses, by that path. The tenant sets the library path, and an
 * NVML of its own first on it made a context cost 274 MiB instead of 524.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "nvml.h"
#include "common.h"
#include "config.h"
#include "devices.h"
#include "driver.h"
#include "init.h"
#include "claim_limits.h"
#include "log.h"
#include "region.h"

struct dl_measure_nvml dl_measure;
static _Atomic int measure_claimed, measure_ready;

void dl_measure_nvml_init(void) {
    if (atomic_load_explicit(&measure_ready, memory_order_acquire)) return;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&measure_claimed, &expected, 1)) {
        while (!atomic_load_explicit(&measure_ready, memory_order_acquire)) sched_yield();
        return;
    }
    Dl_info info;
    char path[4200];
    const char *slash = NULL;
    if (dl_cuda.cuInit && dladdr((void *)dl_cuda.cuInit, &info) && info.dli_fname) slash = strrchr(info.dli_fname, '/');
    void *h = NULL;
    if (slash) {
        snprintf(path, sizeof path, "%.*s/libnvidia-ml.so.1", (int)(slash - info.dli_fname), info.dli_fname);
        h = dlopen(path, RTLD_NOW | RTLD_NODELETE);
        if (!h) dl_debug("no NVML beside the driver (%s): contexts are charged without it", path);
    }
    if (h) {
        dl_dlsym_fn real = dl_real_dlsym();
        dl_measure.nvmlInit_v2 = (dl_pfn_nvmlInit_v2)real(h, "nvmlInit_v2");
        dl_measure.nvmlShutdown = (dl_pfn_nvmlShutdown)real(h, "nvmlShutdown");
        dl_measure.nvmlDeviceGetHandleByUUID = (dl_pfn_nvmlDeviceGetHandleByUUID)real(h, "nvmlDeviceGetHandleByUUID");
        dl_measure.nvmlDeviceGetMemoryInfo = (dl_pfn_nvmlDeviceGetMemoryInfo)real(h, "nvmlDeviceGetMemoryInfo");
    }
    atomic_store_explicit(&measure_ready, 1, memory_order_release);
}

/* The CUDA ordinal of the GPU with this UUID, if CUDA is already initialised in this process; else -1. */
static int ordinal_for_uuid(const char *uuid) {
    if (!atomic_load_explicit(&dl_cuda_ready, memory_order_acquire)) {
        void *loaded = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!loaded) return -1;
        dlclose(loaded);
        dl_cuda_init();
    }
    int count = 0;
    if (!dl_cuda.cuDeviceGetCount || !dl_cuda.cuDeviceGet || !dl_cuda.cuDeviceGetUuid_v2) return -1;
    /* Without cuInit this fails with CUDA_ERROR_NOT_INITIALIZED unless the application initialised CUDA. */
    if (dl_cuda.cuDeviceGetCount(&count) != CUDA_SUCCESS) return -1;
    for (int i = 0; i < count && i < DL_MAX_DEVICES; i++) {
        CUdevice d;
        CUuuid u;
        char s[DL_UUID_LEN];
        if (dl_cuda.cuDeviceGet(&d, i) != CUDA_SUCCESS || dl_cuda.cuDeviceGetUuid_v2(&u, d) != CUDA_SUCCESS) continue;
        dl_uuid_format((const unsigned char *)u.bytes, s);
        if (dl_uuid_equal(s, uuid)) return i;
    }
    return -1;
}

/* The region entry and limit of an NVML device; -1 when the view stays unchanged. */
static int nvml_device(nvmlDevice_t device, uint64_t *limit) {
    dl_core_init();
    if (!dl_any_limit() || !dl_nvml.nvmlDeviceGetUUID) return -1;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (dl_nvml.nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    uuid[sizeof uuid - 1] = '\0';
    if (strlen(uuid) >= DL_UUID_LEN) return -1;
    /* The region keys devices as the CUDA side formats them: "GPU-" even for a MIG instance. */
    if (strncmp(uuid, "MIG-", 4) == 0) memcpy(uuid, "GPU-", 4);
    int ordinal =
        !dl_config_has_uuid_limit(&dl_cfg, uuid) && dl_config_has_ordinal_limits(&dl_cfg) ? ordinal_for_uuid(uuid) : -1;
    *limit = dl_device_limit(ordinal, uuid);
    if (*limit == DL_NO_LIMIT) return -1;
    return dl_region_device(uuid);
}

DL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    dl_nvml_init();
    if (!dl_nvml.nvmlDeviceGetMemoryInfo) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = dl_nvml.nvmlDeviceGetMemoryInfo(device, memory);
    uint64_t limit, total, free_bytes;
    int dev;
    if (r != NVML_SUCCESS || !memory || (dev = nvml_device(device, &limit)) < 0) return r;
    dl_capped_view(dev, limit, memory->total, memory->free, &total, &free_bytes);
    memory->total = total;
    memory->free = free_bytes;
    memory->used = total - free_bytes;
    return r;
}

DL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    dl_nvml_init();
    if (!dl_nvml.nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = dl_nvml.nvmlDeviceGetMemoryInfo_v2(device, memory);
    uint64_t limit, total, free_bytes;
    int dev;
    if (r != NVML_SUCCESS || !memory || (dev = nvml_device(device, &limit)) < 0) return r;
    dl_capped_view(dev, limit, memory->total, memory->free, &total, &free_bytes);
    uint64_t taken = total - free_bytes;
    memory->total = total;
    memory->free = free_bytes;
    if (memory->reserved > taken) memory->reserved = taken;
    memory->used = taken - memory->reserved;
    return r;
}
