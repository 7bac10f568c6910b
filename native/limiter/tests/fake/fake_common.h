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
 *   FAKE_CUDA_CTX_BYTES      device memory a context (primary or created) takes besides its limits' stack,
 *                            heap and FIFO (default 548995072: what a context took on an H100, driver 580,
 *                            tests/real-gpu/h100-driver-facts.txt)
 *   FAKE_CUDA_REAL_TIMING    1: the real H100's launch latency, event ticks and host costs (default 0)
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_MAX_DEVICES 8

static inline uint64_t fake_env_u64(const char *name, uint64_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? def : (uint64_t)x;
}

static inline int fake_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/*
 * Like the real driver, the fake honours CUDA_VISIBLE_DEVICES when it names GPUs by UUID: it then has
 * exactly those devices, with those UUIDs, in that order (the kubelet plugin's CDI specs name the
 * claim's GPUs this way). Entry i's UUID goes to b; returns the number of leading UUID entries.
 */
static inline int fake_visible_uuid(int i, unsigned char b[16]) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int index = 0;
    while (v && *v) {
        const char *end = strchr(v, ',');
        size_t len = end ? (size_t)(end - v) : strlen(v);
        unsigned char bytes[16];
        int n = 0;
        if (len > 4 && strncmp(v, "GPU-", 4) == 0) {
            for (size_t k = 4; k < len && n < 32; k++) {
                if (v[k] == '-') continue;
                int h = fake_hex(v[k]);
                if (h < 0) break;
                if (n % 2 == 0) bytes[n / 2] = (unsigned char)(h << 4);
                else bytes[n / 2] |= (unsigned char)h;
                n++;
            }
        }
        if (n != 32) break;
        if (index == i && b) memcpy(b, bytes, 16);
        index++;
        if (index >= FAKE_MAX_DEVICES || !end) break;
        v = end + 1;
    }
    return index;
}

static inline int fake_device_count(void) {
    const char *explicit_count = getenv("FAKE_CUDA_DEVICE_COUNT");
    int visible = fake_visible_uuid(-1, NULL);
    if ((!explicit_count || !*explicit_count) && visible > 0) return visible;
    uint64_t n = fake_env_u64("FAKE_CUDA_DEVICE_COUNT", 1);
    return n < 1 ? 1 : n > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (int)n;
}

#define FAKE_CONTEXT_BYTES_DEFAULT 548995072ull
static inline uint64_t fake_context_bytes(void) {
    return fake_env_u64("FAKE_CUDA_CTX_BYTES", FAKE_CONTEXT_BYTES_DEFAULT);
}

static inline uint64_t fake_memory_bytes(void) { return fake_env_u64("FAKE_CUDA_MEMORY_BYTES", 80ull << 30); }

/* The UUIDs CUDA_VISIBLE_DEVICES names, else deterministic ones: GPU-4a5c1e2d-7b3f-4e11-9a60-00000000000<i>. */
static inline void fake_uuid_bytes(int i, unsigned char b[16]) {
    if (i < fake_visible_uuid(-1, NULL) && fake_visible_uuid(i, b) > i) return;
    static const unsigned char base[16] = {0x4a, 0x5c, 0x1e, 0x2d, 0x7b, 0x3f, 0x4e, 0x11,
                                           0x9a, 0x60, 0,    0,    0,    0,    0,    0};
    for (int k = 0; k < 16; k++) b[k] = base[k];
    b[15] = (unsigned char)i;
}

static inline void fake_uuid_string(int i, char *out, size_t len) {
    unsigned char b[16];
    fake_uuid_bytes(i, b);
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

#endif
