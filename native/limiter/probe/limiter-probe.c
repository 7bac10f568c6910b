/*
 * limiter-probe: a tiny CUDA driver client for checking the limiter from inside a container.
 *
 *   limiter-probe info
 *       total=<bytes> free=<bytes>       (cuMemGetInfo_v2 on device 0)
 *       device_total=<bytes>             (cuDeviceTotalMem_v2 of device 0)
 *   limiter-probe alloc <chunk-bytes> [<max-chunks>] [--hold] [--export]
 *       alloc <i> ok | alloc <i> <CUDA error name>    (one line per cuMemAlloc_v2 attempt; max-chunks
 *                                                      0 or omitted: until one is refused)
 *       allocated=<bytes> last=<CUDA error name of the last attempt>
 *       exported=<chunks>                (with --export: each chunk's legacy IPC handle was taken, as a
 *                                         process sharing its memory with others does)
 *       holding                          (with --hold; then sleeps, keeping the memory, until killed)
 *
 * Exit status 0 whenever it ran (a refused allocation included); 2 on usage errors, 3 when the driver
 * cannot be set up. Linked with -lcuda: it runs against the real driver as well as the test fake.
 */
#define _GNU_SOURCE
#include "cuda_min.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *err_name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) {
        static char buf[32];
        snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)r);
        return buf;
    }
    return s;
}

static int usage(void) {
    fprintf(stderr, "usage: limiter-probe info\n"
                    "       limiter-probe alloc <chunk-bytes> [<max-chunks>] [--hold] [--export]\n");
    return 2;
}

static int parse_u64(const char *s, unsigned long long *out) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

static int setup(void) {
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "limiter-probe: cannot set up CUDA device 0: %s\n", err_name(r));
        return -1;
    }
    return 0;
}

static int info(void) {
    size_t free_b = 0, total = 0, dev_total = 0;
    CUresult r = cuMemGetInfo_v2(&free_b, &total);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "limiter-probe: cuMemGetInfo_v2: %s\n", err_name(r));
        return 3;
    }
    r = cuDeviceTotalMem_v2(&dev_total, 0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "limiter-probe: cuDeviceTotalMem_v2: %s\n", err_name(r));
        return 3;
    }
    printf("total=%zu free=%zu\n", total, free_b);
    printf("device_total=%zu\n", dev_total);
    return 0;
}

static int alloc(unsigned long long chunk, unsigned long long max_chunks, int hold, int export) {
    unsigned long long allocated = 0, exported = 0;
    CUresult last = CUDA_SUCCESS;
    for (unsigned long long i = 0; max_chunks == 0 || i < max_chunks; i++) {
        CUdeviceptr p;
        last = cuMemAlloc_v2(&p, (size_t)chunk);
        printf("alloc %llu %s\n", i, last == CUDA_SUCCESS ? "ok" : err_name(last));
        if (last != CUDA_SUCCESS) break;
        allocated += chunk;
        CUipcMemHandle h;
        if (export && cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS) exported++;
    }
    printf("allocated=%llu last=%s\n", allocated, err_name(last));
    if (export) printf("exported=%llu\n", exported);
    if (hold) {
        printf("holding\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "info") == 0) {
        if (argc != 2) return usage();
        if (setup() != 0) return 3;
        return info();
    }
    if (strcmp(argv[1], "alloc") == 0) {
        unsigned long long chunk = 0, max_chunks = 0;
        int hold = 0, export = 0, pos = 0;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--hold") == 0) {
                hold = 1;
            } else if (strcmp(argv[i], "--export") == 0) {
                export = 1;
            } else if (pos == 0 && parse_u64(argv[i], &chunk) == 0 && chunk > 0) {
                pos++;
            } else if (pos == 1 && parse_u64(argv[i], &max_chunks) == 0) {
                pos++;
            } else {
                return usage();
            }
        }
        if (pos < 1) return usage();
        if (setup() != 0) return 3;
        return alloc(chunk, max_chunks, hold, export);
    }
    return usage();
}
