/*
 * Timing events die with their context. With a compute share, the limiter keeps spare timing events per
 * context; when the context is destroyed (here the primary context, released by its last user or reset)
 * and a new one comes at the same address, as the driver may do, none of the old context's events may be
 * used again. The fake counts every use of an event of a destroyed context.
 *
 * usage: t_ctx limited|baseline    (run with DRAGPU_CORES_LIMIT below 100)
 */
#include "device.h"

unsigned long fakecuda_stale_event_uses(void);

static void launches(CUcontext *ctx_out) {
    CUmodule mod;
    CUfunction f;
    *ctx_out = use_device0();
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&f, mod, "small"), CUDA_SUCCESS);
    for (int i = 0; i < 40; i++) {
        CHECK_CU(cuLaunchKernel(f, 132, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        if (i % 8 == 7) CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
    }
    CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    limited_mode(argc, argv);
    CUcontext first, second;
    launches(&first);
    CHECK_CU(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_CU(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS); /* the last reference: destroyed */
    launches(&second);
    CHECK(second == first, "the fake makes the new primary context at the old address");
    CHECK(fakecuda_stale_event_uses() == 0, "%lu uses of events of the released context", fakecuda_stale_event_uses());
    CHECK_CU(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
    launches(&second);
    CHECK(fakecuda_stale_event_uses() == 0, "%lu uses of events of the reset context", fakecuda_stale_event_uses());
    printf("t_ctx %s: ok\n", argv[1]);
    return 0;
}
