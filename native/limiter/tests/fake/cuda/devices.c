/*
 * Devices: their count (FAKE_CUDA_DEVICE_COUNT, or the GPUs CUDA_VISIBLE_DEVICES names by UUID, as the real
 * driver), names, UUIDs, memory and the attributes the limiter and the tests read (multiprocessors, threads per
 * multiprocessor and block, compute capability 9.0, memory pools and cooperative launch supported; 0 for the
 * rest), in each ABI the driver exports them (the CUDA 2.0 cuDeviceTotalMem answers in 32 bits).
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <stdio.h>

EXPORT CUresult cuDeviceGetCount(int *n) {
    COUNT();
    CHECK(0);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = G.count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    COUNT();
    CHECK(0);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            *v = (int)G.sms;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
            *v = THREADS_PER_SM;
            break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            *v = 1024;
            break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            *v = 9;
            break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            *v = 0;
            break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            *v = 1;
            break;
        case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
            *v = 1;
            break;
        default:
            *v = 0;
    }
    return CUDA_SUCCESS;
}

static CUresult uuid(CUuuid *u, CUdevice d) {
    CHECK(0);
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(d, (unsigned char *)u->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    COUNT();
    return uuid(u, d);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    COUNT();
    return uuid(u, d);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)G.memory;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    COUNT();
    CHECK(0);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = clamp32(G.memory);
    return CUDA_SUCCESS;
}
