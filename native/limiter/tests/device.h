/* For tests linked with -lcuda: the assertions plus the driver set-up every such test starts with. */
#ifndef LIMITER_TEST_DEVICE_H
#define LIMITER_TEST_DEVICE_H

#include "check.h"

#include "cuda_min.h"

/* cuInit, then device 0's primary context made current: what every CUDA program does first. */
static inline CUcontext use_device0(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return ctx;
}

#endif
