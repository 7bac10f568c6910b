/*
 * Replays the CUDA runtime's way of reaching the driver: dlopen("libcuda.so.1"), one dlsym of
 * cuGetProcAddress_v2, then lookups by base name + ABI version + stream flag, including the self-lookups
 * of cuGetProcAddress at 11030 (4 arguments) and 12000 (5 arguments). Every lookup of an entry point the
 * limiter wraps must return the limiter's wrapper of exactly the variant the driver chose (legacy vs
 * per-thread stream, _v2 vs base); others return the driver's own function; statuses are the driver's.
 * Calls through the returned pointers are limited and reach the matching fake variant.
 */
#include "check.h"

#include "cuda_min.h"

static PFN_cuGetProcAddress_v12000 gpa;
static int limited;

/* Looks up (name, version, flags) and checks the owner and exact symbol of the result. */
static void *expect(const char *name, int version, cuuint64_t flags, const char *wrapped_symbol, int wrapped) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = -1;
    CHECK_CU(gpa(name, &p, version, flags, &st), CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "%s@%d: status %d", name, version, (int)st);
    const char *sym, *own = owner_of(p, &sym);
    const char *want_owner = wrapped && limited ? "limiter" : "fake";
    CHECK(strcmp(own, want_owner) == 0 && strcmp(sym, wrapped_symbol) == 0,
          "cuGetProcAddress_v2(%s, %d, %llu) -> %s in %s, expected %s in %s", name, version, (unsigned long long)flags,
          sym, own, wrapped_symbol, want_owner);
    return p;
}

#define PT CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
#define LEGACY CU_GET_PROC_ADDRESS_LEGACY_STREAM

int main(int argc, char **argv) {
    limited = limited_mode(argc, argv);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h, "dlopen: %s", dlerror());
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa, "no cuGetProcAddress_v2");
    unsigned long (*calls)(const char *) = (unsigned long (*)(const char *))dlsym(h, "fakecuda_calls");

    /* The runtime's first lookups. */
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st;
    CHECK_CU(gpa("", &p, 0, 0, &st), CUDA_SUCCESS);
    CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "empty name: %p status %d", p, (int)st);
    PFN_cuInit_v2000 init = (PFN_cuInit_v2000)expect("cuInit", 2000, 0, "cuInit", 0);
    PFN_cuGetProcAddress_v11030 gpa4 =
        (PFN_cuGetProcAddress_v11030)expect("cuGetProcAddress", 11030, 0, "cuGetProcAddress", 1);
    PFN_cuGetProcAddress_v12000 gpa5 =
        (PFN_cuGetProcAddress_v12000)expect("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 1);
    gpa = gpa5; /* from here on, the runtime uses the resolver it got back */

    /* Memory: the versions the runtime asks for, and the CUDA 2.0 ABI (wrapped with its own ABI). */
    PFN_cuMemAlloc_v3020 alloc = (PFN_cuMemAlloc_v3020)expect("cuMemAlloc", 3020, 0, "cuMemAlloc_v2", 1);
    expect("cuMemAlloc", 2000, 0, "cuMemAlloc", 1);
    expect("cuMemFree", 3020, 0, "cuMemFree_v2", 1);
    expect("cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2", 1);
    expect("cuMemAllocManaged", 6000, 0, "cuMemAllocManaged", 1);
    PFN_cuMemGetInfo_v3020 info = (PFN_cuMemGetInfo_v3020)expect("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2", 1);
    expect("cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2", 1);
    expect("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync", 1);
    PFN_cuMemAllocAsync_v11020_ptsz alloc_async_pt =
        (PFN_cuMemAllocAsync_v11020_ptsz)expect("cuMemAllocAsync", 11020, PT, "cuMemAllocAsync_ptsz", 1);
    expect("cuMemAllocFromPoolAsync", 11020, LEGACY, "cuMemAllocFromPoolAsync", 1);
    expect("cuMemAllocFromPoolAsync", 11020, PT, "cuMemAllocFromPoolAsync_ptsz", 1);
    expect("cuMemFreeAsync", 11020, 0, "cuMemFreeAsync", 1);
    expect("cuMemFreeAsync", 11020, PT, "cuMemFreeAsync_ptsz", 1);
    expect("cuMemCreate", 10020, 0, "cuMemCreate", 1);
    expect("cuMemRelease", 10020, 0, "cuMemRelease", 1);
    expect("cuMemMap", 10020, 0, "cuMemMap", 1);
    expect("cuMemUnmap", 10020, 0, "cuMemUnmap", 1);
    expect("cuMemRetainAllocationHandle", 11000, 0, "cuMemRetainAllocationHandle", 1);
    expect("cuArrayCreate", 3020, 0, "cuArrayCreate_v2", 1);
    expect("cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2", 1);
    expect("cuMipmappedArrayCreate", 5000, 0, "cuMipmappedArrayCreate", 1);

    /* Launches: legacy and per-thread variants are different functions. */
    PFN_cuLaunchKernel_v4000 launch = (PFN_cuLaunchKernel_v4000)expect("cuLaunchKernel", 4000, 0, "cuLaunchKernel", 1);
    PFN_cuLaunchKernel_v7000_ptsz launch_pt =
        (PFN_cuLaunchKernel_v7000_ptsz)expect("cuLaunchKernel", 7000, PT, "cuLaunchKernel_ptsz", 1);
    CHECK(launch != (void *)launch_pt, "legacy and per-thread launches must differ");
    expect("cuLaunchKernel", 7000, 0, "cuLaunchKernel", 1);
    expect("cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx", 1);
    expect("cuLaunchKernelEx", 11060, PT, "cuLaunchKernelEx_ptsz", 1);
    expect("cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel", 1);
    expect("cuLaunchCooperativeKernel", 9000, PT, "cuLaunchCooperativeKernel_ptsz", 1);
    expect("cuGraphLaunch", 10000, 0, "cuGraphLaunch", 1);
    expect("cuGraphLaunch", 10000, PT, "cuGraphLaunch_ptsz", 1);
    expect("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2", 1);
    expect("cuStreamBeginCapture", 10010, PT, "cuStreamBeginCapture_v2_ptsz", 1);
    expect("cuStreamEndCapture", 10000, PT, "cuStreamEndCapture_ptsz", 1);

    /* Contexts hold memory: each ABI variant of cuCtxCreate is wrapped exactly. */
    expect("cuCtxCreate", 3020, 0, "cuCtxCreate_v2", 1);
    expect("cuCtxCreate", 11040, 0, "cuCtxCreate_v3", 1);
    expect("cuCtxCreate", 12050, 0, "cuCtxCreate_v4", 1);

    /* Entry points we do not wrap: the driver's exact variants. */
    expect("cuMemcpyHtoD", 7000, PT, "cuMemcpyHtoD_v2_ptds", 0);
    expect("cuMemPrefetchAsync", 8000, 0, "cuMemPrefetchAsync", 0);
    expect("cuMemPrefetchAsync", 12020, PT, "cuMemPrefetchAsync_v2_ptsz", 0);

    /* Statuses: unknown name, version too old, version newer than the driver. */
    p = (void *)1;
    CHECK_CU(gpa("cuNoSuchFunction", &p, 12000, 0, &st), CUDA_SUCCESS);
    CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown: %p %d", p, (int)st);
    p = (void *)1;
    CHECK_CU(gpa("cuLaunchKernelEx", &p, 11000, 0, &st), CUDA_SUCCESS);
    CHECK(p == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "too old: %p %d", p, (int)st);
    CHECK_CU(gpa("cuMemAlloc", &p, 13010, 0, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(gpa("cuMemAlloc", NULL, 3020, 0, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(gpa("cuMemAlloc", &p, 3020, 0, NULL), CUDA_SUCCESS); /* symbolStatus is optional */

    /* The 4-argument resolver routes the same way, its own self-lookup included. */
    p = NULL;
    CHECK_CU(gpa4("cuMemAlloc", &p, 3020, 0), CUDA_SUCCESS);
    CHECK_OWNER(p, limited ? "limiter" : "fake", "cuMemAlloc_v2");
    CHECK_CU(gpa4("cuGetProcAddress", &p, 12000, 0), CUDA_SUCCESS);
    CHECK_OWNER(p, limited ? "limiter" : "fake", "cuGetProcAddress_v2");
    CHECK_CU(gpa4("cuLaunchKernel", &p, 7000, PT), CUDA_SUCCESS);
    CHECK_OWNER(p, limited ? "limiter" : "fake", "cuLaunchKernel_ptsz");

    /* The resolved pointers are limited, and reach the variant they stand for. */
    PFN_cuDeviceGet_v2000 get = (PFN_cuDeviceGet_v2000)expect("cuDeviceGet", 2000, 0, "cuDeviceGet", 0);
    PFN_cuDevicePrimaryCtxRetain_v7000 retain =
        (PFN_cuDevicePrimaryCtxRetain_v7000)expect("cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain", 1);
    PFN_cuCtxSetCurrent_v4000 set = (PFN_cuCtxSetCurrent_v4000)expect("cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent", 0);
    PFN_cuModuleLoadData_v2000 load =
        (PFN_cuModuleLoadData_v2000)expect("cuModuleLoadData", 2000, 0, "cuModuleLoadData", 0);
    PFN_cuModuleGetFunction_v2000 getfn =
        (PFN_cuModuleGetFunction_v2000)expect("cuModuleGetFunction", 2000, 0, "cuModuleGetFunction", 0);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK_CU(init(0), CUDA_SUCCESS);
    CHECK_CU(get(&dev, 0), CUDA_SUCCESS);
    CHECK_CU(retain(&ctx, dev), CUDA_SUCCESS);
    CHECK_CU(set(ctx), CUDA_SUCCESS);
    CHECK_CU(load(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(getfn(&fn, mod, "k"), CUDA_SUCCESS);

    CUdeviceptr a, b;
    CHECK_CU(alloc(&a, 600 * MiB), CUDA_SUCCESS);
    unsigned long before = calls("cuMemAllocAsync_ptsz");
    CHECK_CU(alloc_async_pt(&b, 600 * MiB, NULL), limited ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
    CHECK_EQ_U64(calls("cuMemAllocAsync_ptsz"), before + (limited ? 0 : 1));
    size_t free_b, total;
    CHECK_CU(info(&free_b, &total), CUDA_SUCCESS);
    if (limited) {
        CHECK_EQ_U64(total, 1 * GiB);
        CHECK_EQ_U64(free_b, 424 * MiB);
    }
    unsigned long legacy = calls("cuLaunchKernel"), per_thread = calls("cuLaunchKernel_ptsz");
    CHECK_CU(launch_pt(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_CU(launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ_U64(calls("cuLaunchKernel_ptsz"), per_thread + 1);
    CHECK_EQ_U64(calls("cuLaunchKernel"), legacy + 1);
    printf("t_getproc %s: ok\n", limited ? "limited" : "baseline");
    return 0;
}
