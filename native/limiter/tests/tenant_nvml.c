/*
 * A tenant's own libnvidia-ml.so.1, put first on the library path: it says every GPU is all free, always. The
 * limiter must not measure a context with it (tests/run.sh: t_paths contexts with it first on the path).
 */
#include <string.h>

#include "nvml_min.h"

#define TOTAL (80ull << 30)

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(unsigned long)1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    (void)device;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = TOTAL;
    memory->free = TOTAL;
    memory->used = 0;
    return NVML_SUCCESS;
}
