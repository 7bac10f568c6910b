/* What every file of the library shares: the CUDA and NVML declarations, attributes, table sizes. */
#ifndef DRAGPU_COMMON_H
#define DRAGPU_COMMON_H

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
#define DL_UUID_LEN 48    /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (40) + NUL, rounded up */
#define DL_NO_LIMIT UINT64_MAX

/* A 64-bit mixer (the murmur3 finaliser) for the process-local hash tables. */
static inline uint64_t dl_hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

#endif
