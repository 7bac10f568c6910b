/*
 * Minimal NVML declarations (no nvml.h is available to the build). Values and layouts follow NVIDIA's
 * nvml.h as mirrored by the nvidia-ml-py bindings (c_nvmlMemory_t, c_nvmlMemory_v2_t, nvmlMemory_v2).
 * Used by the limiter and by the fake libnvidia-ml.so.1 in tests/fake.
 */
#ifndef DRAGPU_NVML_MIN_H
#define DRAGPU_NVML_MIN_H

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2) /* 0x02000028 */
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef nvmlReturn_t (*dl_pfn_nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*dl_pfn_nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*dl_pfn_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*dl_pfn_nvmlInit_v2)(void);
typedef nvmlReturn_t (*dl_pfn_nvmlShutdown)(void);
typedef nvmlReturn_t (*dl_pfn_nvmlDeviceGetHandleByUUID)(const char *, nvmlDevice_t *);

#endif
