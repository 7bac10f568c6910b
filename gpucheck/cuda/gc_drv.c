/*
 * gc_drv: a CUDA driver-API program for the GPU check (linked with -lcuda).
 *
 * Every mode prints `key=value` lines on stdout, flushed, and exits 0 when it ran (a refused
 * allocation included), 2 for a usage error, 3 when CUDA device 0 cannot be set up.
 *
 *   gc_drv info                           total= free= (cuMemGetInfo) device_total= uuid=
 *   gc_drv family <name> <chunk> <max> [--hold]
 *       allocate with one allocation family until the driver (or the limiter) refuses or <max>
 *       bytes are held; then, for the plain families, halve the chunk down to 1 MiB to fill the rest.
 *       names: mem pitch managed async pool vmm array graph dlsym-next dlopen getproc
 *       prints allocated= last= count= stopped=(refused|max); with --hold, then held_ns= (CLOCK_MONOTONIC
 *       once it holds it all) and `holding`, and keeps the memory until stdin reaches end of file.
 *   gc_drv share ipc|vmm <bytes> <chunk>
 *       two processes of one claim sharing memory: this one allocates <bytes> (cuMemAlloc, or cuMemCreate
 *       exported as a POSIX descriptor), exports it and runs `gc_drv open` (same environment, so the same
 *       claim), which opens or imports and maps it, then fills what is left with `family mem`.
 *       prints shared= exporter_free= child_status=; the second process prints kcmp=(0|1) opened= and
 *       the family's lines. Under the limiter the claim holds the shared memory once.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024ULL)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

static CUdevice g_dev;
static CUcontext g_ctx;
static CUstream g_stream;
static CUmemoryPool g_pool;
static alloc_fn g_resolved;
static size_t g_granularity = 2 * MIB;

static const char *err_name(CUresult r) {
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) return "CUDA_ERROR_UNKNOWN";
    return name;
}

static int setup(void) {
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGet(&g_dev, 0);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&g_ctx, g_dev);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(g_ctx);
    if (r != CUDA_SUCCESS) {
        printf("error=%s\n", err_name(r));
        fprintf(stderr, "gc_drv: cannot set up CUDA device 0: %s\n", err_name(r));
        return 3;
    }
    return 0;
}

static void print_uuid(void) {
    CUuuid u;
    if (cuDeviceGetUuid(&u, g_dev) != CUDA_SUCCESS) return;
    const unsigned char *b = (const unsigned char *)u.bytes;
    printf("uuid=GPU-");
    for (int i = 0; i < 16; i++) {
        printf("%02x", b[i]);
        if (i == 3 || i == 5 || i == 7 || i == 9) printf("-");
    }
    printf("\n");
}

static int cmd_info(void) {
    size_t free_b = 0, total_b = 0, dev_total = 0;
    CUresult r = cuMemGetInfo(&free_b, &total_b);
    if (r != CUDA_SUCCESS) printf("mem_get_info_error=%s\n", err_name(r));
    else printf("total=%zu\nfree=%zu\n", total_b, free_b);
    r = cuDeviceTotalMem(&dev_total, g_dev);
    if (r == CUDA_SUCCESS) printf("device_total=%zu\n", dev_total);
    print_uuid();
    return 0;
}

static CUmemPoolProps pool_props(void) {
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = (int)g_dev;
    return p;
}

/* Keep freed pool memory reserved, so that what the pool holds is what was allocated. */
static void keep_pool(CUmemoryPool pool) {
    cuuint64_t threshold = UINT64_MAX;
    cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
}

/* Physical memory of device 0 for cuMemCreate, exportable as the handle types named. */
static CUmemAllocationProp device_prop(CUmemAllocationHandleType handle_types) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = handle_types;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)g_dev;
    return prop;
}

static int family_setup(const char *name) {
    CUresult r = CUDA_SUCCESS;
    if (!strcmp(name, "async") || !strcmp(name, "pool") || !strcmp(name, "graph")) {
        r = cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING);
    }
    if (r == CUDA_SUCCESS && !strcmp(name, "async")) {
        r = cuDeviceGetDefaultMemPool(&g_pool, g_dev);
        if (r == CUDA_SUCCESS) keep_pool(g_pool);
    } else if (r == CUDA_SUCCESS && !strcmp(name, "pool")) {
        CUmemPoolProps p = pool_props();
        r = cuMemPoolCreate(&g_pool, &p);
        if (r == CUDA_SUCCESS) keep_pool(g_pool);
    } else if (r == CUDA_SUCCESS && !strcmp(name, "vmm")) {
        CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_NONE);
        r = cuMemGetAllocationGranularity(&g_granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    } else if (!strcmp(name, "dlsym-next")) {
        g_resolved = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
        if (g_resolved == NULL) g_resolved = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        if (g_resolved == NULL) r = CUDA_ERROR_NOT_FOUND;
    } else if (!strcmp(name, "dlopen")) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        g_resolved = h ? (alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
        if (g_resolved == NULL) r = CUDA_ERROR_NOT_FOUND;
    } else if (!strcmp(name, "getproc")) {
        void *p = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
        r = cuGetProcAddress("cuMemAlloc", &p, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        if (r == CUDA_SUCCESS && (p == NULL || status != CU_GET_PROC_ADDRESS_SUCCESS)) r = CUDA_ERROR_NOT_FOUND;
        g_resolved = (alloc_fn)p;
    }
    if (r != CUDA_SUCCESS) printf("setup_error=%s\n", err_name(r));
    return r == CUDA_SUCCESS ? 0 : 1;
}

/* One allocation of `size` bytes by the family; the memory stays held until the process exits. */
static CUresult family_alloc(const char *name, size_t size) {
    CUdeviceptr p = 0;
    CUresult r;
    if (!strcmp(name, "mem")) return cuMemAlloc(&p, size);
    if (!strcmp(name, "managed")) return cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(name, "pitch")) {
        size_t pitch = 0, width = 64 * 1024, height = size / width ? size / width : 1;
        return cuMemAllocPitch(&p, &pitch, width, height, 16);
    }
    if (!strcmp(name, "async")) {
        r = cuMemAllocAsync(&p, size, g_stream);
        return r == CUDA_SUCCESS ? cuStreamSynchronize(g_stream) : r;
    }
    if (!strcmp(name, "pool")) {
        r = cuMemAllocFromPoolAsync(&p, size, g_pool, g_stream);
        return r == CUDA_SUCCESS ? cuStreamSynchronize(g_stream) : r;
    }
    if (!strcmp(name, "vmm")) {
        CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_NONE);
        CUmemGenericAllocationHandle h;
        CUmemAccessDesc access;
        size = (size + g_granularity - 1) / g_granularity * g_granularity;
        r = cuMemCreate(&h, size, &prop, 0);
        if (r != CUDA_SUCCESS) return r;
        r = cuMemAddressReserve(&p, size, 0, 0, 0);
        if (r == CUDA_SUCCESS) r = cuMemMap(p, size, 0, h, 0);
        memset(&access, 0, sizeof access);
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (r == CUDA_SUCCESS) r = cuMemSetAccess(p, size, &access, 1);
        /* Released at once, as llama.cpp and the samples do: the mapping keeps it alive. */
        cuMemRelease(h);
        return r;
    }
    if (!strcmp(name, "array")) {
        CUDA_ARRAY_DESCRIPTOR d;
        CUarray a;
        memset(&d, 0, sizeof d);
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        d.Width = 4096;
        d.Height = size / (4096 * 16) ? size / (4096 * 16) : 1;
        return cuArrayCreate(&a, &d);
    }
    if (!strcmp(name, "graph")) {
        CUgraph g;
        CUgraphNode node;
        CUgraphExec exec;
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps = pool_props();
        params.bytesize = size;
        r = cuGraphCreate(&g, 0);
        if (r != CUDA_SUCCESS) return r;
        /* No free node: the allocation outlives the launch until freed (never, here). */
        r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &params);
        if (r == CUDA_SUCCESS) r = cuGraphInstantiate(&exec, g, 0);
        if (r == CUDA_SUCCESS) r = cuGraphLaunch(exec, g_stream);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(g_stream);
        return r;
    }
    if (g_resolved != NULL) return g_resolved(&p, size);
    return CUDA_ERROR_INVALID_VALUE;
}

static int plain_family(const char *name) {
    return strcmp(name, "graph") != 0 && strcmp(name, "vmm") != 0 && strcmp(name, "array") != 0 &&
           strcmp(name, "pitch") != 0;
}

static void hold(void) {
    char buf[256];
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    printf("held_ns=%lld\nholding\n", (long long)now.tv_sec * 1000000000LL + (long long)now.tv_nsec);
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {
    }
}

static int cmd_family(const char *name, size_t chunk, size_t max, int do_hold) {
    if (family_setup(name) != 0) return 0;
    size_t allocated = 0, count = 0, min_chunk = MIB;
    CUresult last = CUDA_SUCCESS;
    const char *stopped = "refused";
    if (!plain_family(name)) min_chunk = chunk;
    for (size_t c = chunk; c >= min_chunk; c /= 2) {
        for (;;) {
            if (allocated + c > max) break;
            last = family_alloc(name, c);
            if (last != CUDA_SUCCESS) break;
            allocated += c;
            count++;
        }
        if (last == CUDA_SUCCESS) {
            stopped = "max";
            break;
        }
        if (last != CUDA_ERROR_OUT_OF_MEMORY) break;
        if (c == min_chunk) break;
    }
    printf("allocated=%zu\ncount=%zu\nlast=%s\nstopped=%s\n", allocated, count,
           last == CUDA_SUCCESS ? "CUDA_SUCCESS" : err_name(last), stopped);
    size_t free_b = 0, total_b = 0;
    if (cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS) printf("after_total=%zu\nafter_free=%zu\n", total_b, free_b);
    fflush(stdout);
    if (do_hold) hold();
    return 0;
}

static int usage(void);

static int cmd_share(const char *self, const char *kind, size_t bytes, const char *chunk) {
    char arg[2 * sizeof(CUipcMemHandle) + 1] = "";
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    if (!strcmp(kind, "ipc")) {
        CUipcMemHandle ih;
        r = cuMemAlloc(&p, bytes);
        if (r == CUDA_SUCCESS) r = cuIpcGetMemHandle(&ih, p);
        for (size_t i = 0; r == CUDA_SUCCESS && i < sizeof ih.reserved; i++)
            snprintf(arg + 2 * i, 3, "%02x", (unsigned char)ih.reserved[i]);
    } else {
        CUmemAllocationProp prop = device_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        int fd = -1;
        size_t granularity = 0;
        r = cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r == CUDA_SUCCESS && granularity) bytes = (bytes + granularity - 1) / granularity * granularity;
        if (r == CUDA_SUCCESS) r = cuMemCreate(&h, bytes, &prop, 0);
        if (r == CUDA_SUCCESS) r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r == CUDA_SUCCESS) {
            fcntl(fd, F_SETFD, 0); /* the second process gets this very descriptor across exec */
            snprintf(arg, sizeof arg, "%d", fd);
        }
    }
    if (r != CUDA_SUCCESS) {
        printf("setup_error=%s\n", err_name(r));
        return 0;
    }
    size_t free_b = 0, total_b = 0;
    cuMemGetInfo(&free_b, &total_b);
    printf("shared=%zu\nexporter_free=%zu\n", bytes, free_b);
    fflush(stdout);
    char size_arg[32];
    snprintf(size_arg, sizeof size_arg, "%zu", bytes);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", self, "open", kind, arg, size_arg, chunk, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) status = -1;
    printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (p) cuMemFree(p);
    if (h) cuMemRelease(h);
    return 0;
}

static int hex_nibble(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int cmd_open(const char *kind, const char *arg, size_t bytes, size_t chunk) {
    /* Whether the kernel lets this process compare descriptors: the limiter needs it for VMM memory. */
    printf("kcmp=%d\n", syscall(SYS_kcmp, getpid(), getpid(), 0, 0, 0) == 0);
    CUresult r;
    if (!strcmp(kind, "ipc")) {
        CUipcMemHandle ih;
        CUdeviceptr p;
        if (strlen(arg) != 2 * sizeof ih.reserved) return usage();
        for (size_t i = 0; i < sizeof ih.reserved; i++) {
            int hi = hex_nibble(arg[2 * i]), lo = hex_nibble(arg[2 * i + 1]);
            if (hi < 0 || lo < 0) return usage();
            ih.reserved[i] = (char)(hi << 4 | lo);
        }
        r = cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    } else {
        CUmemGenericAllocationHandle h;
        CUdeviceptr va = 0;
        int fd = atoi(arg);
        r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r == CUDA_SUCCESS) r = cuMemAddressReserve(&va, bytes, 0, 0, 0);
        if (r == CUDA_SUCCESS) r = cuMemMap(va, bytes, 0, h, 0);
    }
    printf("opened=%s\n", r == CUDA_SUCCESS ? "CUDA_SUCCESS" : err_name(r));
    fflush(stdout);
    return r == CUDA_SUCCESS ? cmd_family("mem", chunk, SIZE_MAX / 2, 0) : 0;
}

static int usage(void) {
    fprintf(stderr, "usage: gc_drv info | gc_drv family <name> <chunk-bytes> <max-bytes> [--hold]\n"
                    "       gc_drv share ipc|vmm <bytes> <chunk-bytes>\n");
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "info")) {
        int rc = setup();
        return rc ? rc : cmd_info();
    }
    if (!strcmp(argv[1], "family") && (argc == 5 || argc == 6)) {
        char *end1, *end2;
        unsigned long long chunk = strtoull(argv[3], &end1, 10), max = strtoull(argv[4], &end2, 10);
        int do_hold = argc == 6 && !strcmp(argv[5], "--hold");
        if (*end1 || *end2 || chunk == 0 || (argc == 6 && !do_hold)) return usage();
        int rc = setup();
        return rc ? rc : cmd_family(argv[2], (size_t)chunk, (size_t)max, do_hold);
    }
    if ((!strcmp(argv[1], "share") && argc == 5) || (!strcmp(argv[1], "open") && argc == 6)) {
        int share = !strcmp(argv[1], "share");
        const char *kind = argv[2], *size = argv[share ? 3 : 4], *chunk = argv[share ? 4 : 5];
        char *end1, *end2;
        unsigned long long bytes = strtoull(size, &end1, 10), chunk_bytes = strtoull(chunk, &end2, 10);
        if ((strcmp(kind, "ipc") && strcmp(kind, "vmm")) || *end1 || *end2 || !bytes || !chunk_bytes)
            return usage();
        int rc = setup();
        if (rc) return rc;
        if (share) return cmd_share(argv[0], kind, (size_t)bytes, chunk);
        return cmd_open(kind, argv[3], (size_t)bytes, (size_t)chunk_bytes);
    }
    return usage();
}
