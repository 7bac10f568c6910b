/*
 * fork(): the child must not inherit the parent's slot (whose lock would then outlive the parent) nor its
 * charges (which are the parent's). Parent and child count against one claim-wide limit, each in its own
 * slot; when the child exits its memory returns, and the parent's own allocations stay charged until it
 * frees them. A fork while other threads allocate and free must leave the child no lock of theirs: every
 * child allocates, frees and exits within its deadline.
 */
#include "device.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHURN_THREADS 4
#define FORKS 40
#define CHILD_DEADLINE_MS 10000

static CUcontext ctx;
static _Atomic int stop_churn;

static size_t free_now(void) {
    size_t f, t;
    CHECK_CU(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ_U64(t, 1 * GiB);
    return f;
}

/* Allocates and frees as fast as it can until told to stop: the ledger's and the region's locks are taken
 * all the time, so a fork lands while one of them is held. */
static void *churn(void *arg) {
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    unsigned long rounds = 0;
    while (!atomic_load(&stop_churn)) {
        CUdeviceptr d;
        CHECK_CU(cuMemAlloc_v2(&d, 1 * MiB), CUDA_SUCCESS);
        CHECK_CU(cuMemFree_v2(d), CUDA_SUCCESS);
        rounds++;
    }
    return (void *)(uintptr_t)rounds;
}

/* The child's status, or -1 (after killing it) when it has not exited by the deadline: a child stuck on a
 * lock its parent's other threads held must fail the test, not hang it. */
static int wait_deadline(pid_t pid) {
    for (int ms = 0; ms < CHILD_DEADLINE_MS; ms++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void fork_while_threads_allocate(void) {
    pthread_t t[CHURN_THREADS];
    for (int i = 0; i < CHURN_THREADS; i++) CHECK(pthread_create(&t[i], NULL, churn, NULL) == 0, "pthread_create");
    for (int i = 0; i < FORKS; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork failed");
        if (pid == 0) {
            CUdeviceptr d;
            CUresult r = cuMemAlloc_v2(&d, 1 * MiB);
            if (r == CUDA_SUCCESS) r = cuMemFree_v2(d);
            _exit(r == CUDA_SUCCESS ? 0 : 1);
        }
        int status = wait_deadline(pid);
        CHECK(status == 0, "fork %d: the child %s", i,
              status < 0 ? "hung (a lock held by one of the parent's threads)" : "failed to allocate and free");
    }
    atomic_store(&stop_churn, 1);
    unsigned long rounds = 0;
    for (int i = 0; i < CHURN_THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        rounds += (unsigned long)(uintptr_t)r;
    }
    CHECK(rounds > 0, "the threads never allocated; the forks tested nothing");
}

int main(void) {
    ctx = use_device0();
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

    fork_while_threads_allocate();
    CHECK_EQ_U64(free_now(), 1 * GiB);
    printf("t_fork: ok (%d forks while %d threads allocated)\n", FORKS, CHURN_THREADS);
    return 0;
}
