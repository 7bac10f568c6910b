/*
 * The shared region is writable by every process of the claim; what one of them does to the file must never
 * turn into more memory. Run with the limiter preloaded, a 1 GiB limit and a fresh state directory; each
 * case rewrites the region the way a misbehaving process could, then allocates:
 *
 *   lowered     the claim-wide total and this process's slot zeroed: the process still cannot pass its
 *               limit (it checks its own charges, which live in its own memory)
 *   impossible  a negative claim-wide total: refused from then on
 *   deleted     the file unlinked: refused from then on (a new file would be a new, empty account)
 *   replaced    another file renamed onto its path (the old one kept under another name): refused
 *   unlocked    the process drops its own slot's lock through the library's descriptor, and a second
 *               process of the claim starts: the memory the first still holds stays charged
 *   forged      (a claim's region, with the node agent's floor at T_REGION_FLOOR, which the test writes as
 *               the agent's watch would) the process drops its slot's lock, names a dead process as its
 *               slot's owner and marks the slot gone as the agent would: a second process of the claim still
 *               cannot allocate what the first holds - the floor, which no process of the claim can write,
 *               says it is held
 *   resized     the file grown: refused from then on
 *   header      the layout fields rewritten: refused from then on
 *   shared      an entry of the shared-memory table holding a negative charge: refused from then on
 *   clock       the compute clock set an hour and more ahead: a launch does not wait for it (run with a
 *               compute share; a hang fails the test after 30 s)
 *
 * Each refusal is logged once, naming the region and the reason.
 *
 * usage: t_region lowered|impossible|deleted|replaced|resized|header|shared|clock|unlocked|forged
 */
#include "device.h"

#include <dirent.h>
#include <stdbool.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Offsets in the file (src/region.c, mirrored by src/dra_gpu/limiter_abi/region.py). */
#define HEADER_BYTES 4096
#define EXPORT_BYTES (128 * 256)
#define SLOTS_AT (HEADER_BYTES + EXPORT_BYTES)
#define SLOT_BYTES 192
#define REGION_BYTES (SLOTS_AT + 1024 * SLOT_BYTES)
#define DEV0_USED (64 + 64)
#define DEV0_TAT (64 + 128)
#define SLOT_USED 24
#define EXPORT_ENTRY_BYTES_AT 32

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: t_region lowered|impossible|deleted|replaced|resized|header|shared|clock|unlocked|forged");
    const char *mode = argv[1], *dir = getenv("DRAGPU_LIMITER_STATE_DIR");
    CHECK(dir, "run with DRAGPU_LIMITER_STATE_DIR set");
    char path[4200];
    snprintf(path, sizeof path, "%s/dragpu-limiter.region", dir);
    use_device0();
    CUdeviceptr held, p;
    CHECK_CU(cuMemAlloc(&held, 768 * MiB), CUDA_SUCCESS);

    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "no region at %s", path);
    char *base = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(base != MAP_FAILED, "mmap");
    int64_t *total = (int64_t *)(base + DEV0_USED);
    CHECK(*total == (int64_t)(768 * MiB), "the claim-wide total is %lld", (long long)*total);

    if (strcmp(mode, "clock") == 0) {
        CUmodule mod;
        CUfunction f;
        CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
        CHECK_CU(cuModuleGetFunction(&f, mod, "small"), CUDA_SUCCESS);
        CHECK_CU(cuLaunchKernel(f, 132, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS); /* clock in use */
        CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        *(int64_t *)(base + DEV0_TAT) = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec + 7200LL * 1000000000LL;
        alarm(30);
        for (int i = 0; i < 10; i++)
            CHECK_CU(cuLaunchKernel(f, 132, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
        alarm(0);
    } else if (strcmp(mode, "unlocked") == 0 || strcmp(mode, "forged") == 0) {
        bool forged = strcmp(mode, "forged") == 0;
        if (forged) { /* the agent's watch: NVML says this process holds 768 MiB; the region said as much */
            const char *floor = getenv("T_REGION_FLOOR"), *uuid = getenv("T_REGION_GPU");
            CHECK(floor && uuid, "forged: run with T_REGION_FLOOR and T_REGION_GPU");
            int f = open(floor, O_RDWR);
            CHECK(f >= 0, "no floor at %s", floor);
            uint64_t seq = 2;
            int64_t figures[2] = {(int64_t)(768 * MiB), (int64_t)(768 * MiB)};
            char name[48] = {0};
            snprintf(name, sizeof name, "%s", uuid);
            CHECK(pwrite(f, name, sizeof name, 64) == (ssize_t)sizeof name &&
                      pwrite(f, figures, sizeof figures, 64 + 48) == (ssize_t)sizeof figures &&
                      pwrite(f, &seq, sizeof seq, 16) == (ssize_t)sizeof seq,
                  "writing the floor");
            close(f);
            /* Its slot names a process that has exited, and is marked gone as only the agent should. */
            pid_t dead = fork();
            CHECK(dead >= 0, "fork");
            if (dead == 0) _exit(0);
            CHECK(waitpid(dead, NULL, 0) == dead, "wait");
            for (int i = 0; i < 1024; i++) {
                char *slot = base + SLOTS_AT + (size_t)i * SLOT_BYTES;
                if (*(int32_t *)(slot + 4) != (int32_t)getpid()) continue;
                *(int32_t *)(slot + 4) = (int32_t)dead;
                *(uint32_t *)slot = 2; /* SLOT_GONE */
            }
        }
        /* Every descriptor of the region the library holds: drop every lock on the slots' bytes. */
        DIR *d = opendir("/proc/self/fd");
        CHECK(d, "opendir");
        struct dirent *e;
        char link[4200], target[4200];
        while ((e = readdir(d)) != NULL) {
            snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n <= 0) continue;
            target[n] = '\0';
            if (strcmp(target, path) != 0) continue;
            struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 1, .l_len = 1024};
            fcntl(atoi(e->d_name), F_OFD_SETLK, &fl);
        }
        closedir(d);
        /* A new process of the claim (it sweeps when it takes a slot): 512 MiB would fit only if the 768 MiB
         * still held here were given back. */
        pid_t child = fork();
        CHECK(child >= 0, "fork");
        if (child == 0) _exit(cuMemAlloc(&p, 512 * MiB) == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1);
        int status;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status), "child");
        CHECK(WEXITSTATUS(status) == 0, "the held 768 MiB were given back: a new process got 512 MiB more");
        if (!forged) CHECK(*total == (int64_t)(768 * MiB), "the claim-wide total is %lld", (long long)*total);
    } else if (strcmp(mode, "lowered") == 0) {
        /* The rewrite a process would do to get more: every counter of the file back to zero. */
        *total = 0;
        for (int i = 0; i < 1024; i++) memset(base + SLOTS_AT + (size_t)i * SLOT_BYTES + SLOT_USED, 0, 128);
        CHECK_CU(cuMemAlloc(&p, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_CU(cuMemAlloc(&p, 256 * MiB), CUDA_SUCCESS); /* up to its limit, not past it */
        CHECK_CU(cuMemAlloc(&p, 1 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    } else {
        if (strcmp(mode, "impossible") == 0) {
            *total = -(int64_t)(1ull << 40);
        } else if (strcmp(mode, "deleted") == 0) {
            CHECK(unlink(path) == 0, "unlink");
        } else if (strcmp(mode, "replaced") == 0) {
            char kept[4300], fresh[4300];
            snprintf(kept, sizeof kept, "%s.kept", path);
            snprintf(fresh, sizeof fresh, "%s.fresh", path);
            CHECK(link(path, kept) == 0, "link");
            int f = open(fresh, O_RDWR | O_CREAT | O_TRUNC, 0600);
            CHECK(f >= 0 && ftruncate(f, REGION_BYTES) == 0, "fresh file");
            close(f);
            CHECK(rename(fresh, path) == 0, "rename");
        } else if (strcmp(mode, "resized") == 0) {
            CHECK(ftruncate(fd, REGION_BYTES + 4096) == 0, "ftruncate");
        } else if (strcmp(mode, "header") == 0) {
            ((uint32_t *)base)[4] = 7; /* slot_count */
        } else if (strcmp(mode, "shared") == 0) {
            /* A shared-memory entry that would give bytes back when retired: a negative charge. */
            char *x = base + HEADER_BYTES;
            *(int64_t *)(x + EXPORT_ENTRY_BYTES_AT) = -(int64_t)(512 * MiB);
            *(uint32_t *)x = 1; /* live */
        } else {
            CHECK(0, "unknown case %s", mode);
        }
        /* The allocation path re-checks the file at most every 100 ms, looking at the clock every 64th
         * allocation: within 64 allocations after that, every allocation is refused. */
        sleep_ms(250);
        int admitted = 0;
        while (admitted < 64 && cuMemAlloc(&p, 1 * MiB) == CUDA_SUCCESS) admitted++;
        CHECK(admitted < 64, "%s: 64 more allocations were admitted", mode);
        CHECK_CU(cuMemAlloc(&p, 1 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
        size_t free_b, total_b;
        CHECK_CU(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
        CHECK(free_b == 0, "a broken region reports %zu bytes free", free_b);
    }
    CHECK_CU(cuMemFree(held), CUDA_SUCCESS);
    printf("t_region %s: ok\n", mode);
    return 0;
}
