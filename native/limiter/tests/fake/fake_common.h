/*
 * Settings shared by the fake libcuda.so.1 and the fake libnvidia-ml.so.1, so that both describe the same
 * simulated GPUs (count, memory, UUIDs).
 *
 *   FAKE_CUDA_DEVICE_COUNT   number of GPUs (default 1, at most 8)
 *   FAKE_CUDA_MEMORY_BYTES   memory per GPU in bytes (default 85899345920 = 80 GiB)
 *   FAKE_CUDA_SM_COUNT       multiprocessors per GPU (default 132)
 *   FAKE_CUDA_WAVE_NS        simulated time of one wave of blocks, ns (default 10000)
 *   FAKE_CUDA_DRIVER_VERSION value of cuDriverGetVersion (default 13000)
 *   FAKE_CUDA_EVENT_CREATE_FAILS  1: cuEventCreate answers CUDA_ERROR_OUT_OF_MEMORY (default 0)
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FAKE_MAX_DEVICES 8

static inline uint64_t fake_env_u64(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? def : (uint64_t)x;
}

static inline int fake_device_count(void) {
    uint64_t n = fake_env_u64("FAKE_CUDA_DEVICE_COUNT", 1);
    return n < 1 ? 1 : n > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (int)n;
}

static inline uint64_t fake_memory_bytes(void) { return fake_env_u64("FAKE_CUDA_MEMORY_BYTES", 80ull << 30); }

/* Deterministic UUIDs: GPU-4a5c1e2d-7b3f-4e11-9a60-00000000000<i>. */
static inline void fake_uuid_bytes(int i, unsigned char b[16]) {
    static const unsigned char base[16] = {0x4a, 0x5c, 0x1e, 0x2d, 0x7b, 0x3f, 0x4e, 0x11,
                                           0x9a, 0x60, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < 16; k++) b[k] = base[k];
    b[15] = (unsigned char)i;
}

static inline void fake_uuid_string(int i, char *out, size_t len) {
    unsigned char b[16];
    fake_uuid_bytes(i, b);
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

#endif
