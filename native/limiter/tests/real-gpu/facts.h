/* What the recording programs (driver-facts.cu, bracket-facts.cu) share: error names, the host clock, the
 * fatal check of a driver call, a sort order for medians. */
#ifndef FACTS_H
#define FACTS_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *err(CUresult r) {
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            printf("fatal=%s:%d %s -> %s\n", __FILE__, __LINE__, #call, err(r_));                                      \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
