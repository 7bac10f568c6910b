/* nvml.c: the capped memory view (NVML side), and the driver's own NVML the library measures with. */
#ifndef DRAGPU_NVML_H
#define DRAGPU_NVML_H

#include "common.h"

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

#endif
