/*
 * fork(): the child must not inherit the parent's slot (whose lock would then outlive the parent) nor its
 * charges (which are the parent's). Parent and child count against one claim-wide limit, each in its own
 * slot; when the child exits its memory returns, and the parent's own allocations stay charged until it
 * frees them.
 */
#include "device.h"
#include <sys/wait.h>
#include <unistd.h>

static size_t free_now(void) {
    size_t f, t;
    CHECK_CU(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ_U64(t, 1 * GiB);
    return f;
}

int main(void) {
    use_device0();
    CUdeviceptr p, q;
    CHECK_CU(cuMemAlloc_v2(&p, 512 * MiB), CUDA_SUCCESS);
    CHECK_EQ_U64(free_now(), 512 * MiB);

    pid_t pid = fork();
    CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
        /* The fake driver's state is copied into the child, so it can keep using the device. The limiter
         * starts over: fresh slot, no inherited charges, and the parent's 512 MiB still count. */
        CHECK_EQ_U64(free_now(), 512 * MiB);
        CHECK_CU(cuMemAlloc_v2(&q, 512 * MiB), CUDA_SUCCESS);
        CHECK_CU(cuMemAlloc_v2(&q, 1 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_EQ_U64(free_now(), 0);
        /* Freeing an allocation of the parent's is the driver's business; it must not refund anything
         * the child never charged. */
        CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
        CHECK_EQ_U64(free_now(), 0);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");

    /* The child's 512 MiB came back when it exited; the parent's are still charged. */
    CHECK_EQ_U64(free_now(), 512 * MiB);
    CHECK_CU(cuMemAlloc_v2(&q, 768 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CU(cuMemAlloc_v2(&q, 512 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    CHECK_EQ_U64(free_now(), 1 * GiB);
    printf("t_fork: ok\n");
    return 0;
}
