/*
 * A fake NVML (libnvidia-ml.so.1) for testing the limiter without a GPU. It describes the same devices
 * as the fake driver (fake_common.h) and keeps NVML's return codes and struct layouts (declared in
 * src/nvml_min.h, cross-checked against nvidia-ml-py). Memory in use is what the fake driver has
 * allocated in this process when it is loaded, else zero.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "fake_common.h"
#include "nvml_min.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x4e564d4cu

struct nvmlDevice_st {
    unsigned magic;
    int index;
};
static struct nvmlDevice_st handles[FAKE_MAX_DEVICES];
static int initialized; /* nvmlInit* calls not yet shut down: NVML counts them */

static nvmlReturn_t device_index(nvmlDevice_t d, int *i) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || d->magic != MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t init(void) {
    for (int i = 0; i < FAKE_MAX_DEVICES; i++) handles[i] = (struct nvmlDevice_st){MAGIC, i};
    initialized++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init();
}
EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
        case NVML_SUCCESS:
            return "Success";
        case NVML_ERROR_UNINITIALIZED:
            return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT:
            return "Invalid Argument";
        case NVML_ERROR_NOT_FOUND:
            return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE:
            return "Insufficient Size";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            return "Argument Version Mismatch";
        default:
            return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)fake_device_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= (unsigned)fake_device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &handles[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fake_device_count(); i++) {
        char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        fake_uuid_string(i, s, sizeof s);
        if (strcmp(s, uuid) == 0) {
            *d = &handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    fake_uuid_string(i, s, sizeof s);
    if (len < strlen(s) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!name || len < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, len, "Fake GPU %d", i);
    return NVML_SUCCESS;
}

static uint64_t used_bytes(int i) {
    /* The fake driver's accounting, when it is loaded in this process. */
    uint64_t (*fn)(int) = (uint64_t (*)(int))dlsym(RTLD_DEFAULT, "fakecuda_used_bytes");
    return fn ? fn(i) : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = fake_memory_bytes();
    m->used = used_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = fake_memory_bytes();
    m->reserved = 0;
    m->used = used_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    if (!v || len < 8) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(v, len, "580.00");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = (int)fake_env_u64("FAKE_CUDA_DRIVER_VERSION", 13000);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }
