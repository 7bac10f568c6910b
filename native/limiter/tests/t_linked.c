/*
 * A program linked with -lcuda (its driver calls bind to the preloaded limiter's exports) against a
 * 1 GiB limit: every allocation family is charged, refused over the limit without reaching the driver,
 * and released by its free; the memory queries report the capped view; NULL out-parameters reach the
 * driver untouched. In "baseline" mode (no limiter) the same over-limit requests succeed, which shows
 * the limiter - not the fake - refused them.
 */
#include "device.h"

/* Per-thread-stream variants: cuda.h declares them only under CUDA_API_PER_THREAD_DEFAULT_STREAM. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

unsigned long fakecuda_calls(const char *name);
uint64_t fakecuda_used_bytes(int device);

static int limited;
static const uint64_t LIMIT = 1 * GiB;

static void expect_free(uint64_t want) {
    if (!limited) return;
    size_t free_b, total;
    CHECK_CU(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK_EQ_U64(total, LIMIT);
    CHECK_EQ_U64(free_b, want);
}

/* An allocation above what is left: refused by the limiter (driver not called) or, without it, served. */
#define OVER(call, fake_name)                                                                                          \
    do {                                                                                                               \
        unsigned long before_ = fakecuda_calls(fake_name);                                                             \
        CUresult r_ = (call);                                                                                          \
        if (limited) {                                                                                                 \
            CHECK(r_ == CUDA_ERROR_OUT_OF_MEMORY, "%s returned %d, expected OOM", #call, r_);                          \
            CHECK_EQ_U64(fakecuda_calls(fake_name), before_);                                                          \
        } else {                                                                                                       \
            CHECK(r_ == CUDA_SUCCESS, "%s returned %d without the limiter", #call, r_);                                \
        }                                                                                                              \
    } while (0)

int main(int argc, char **argv) {
    limited = limited_mode(argc, argv);
    CUdeviceptr p[8];

    /* Before cuInit the driver's own error comes back. */
    CHECK_CU(cuMemAlloc_v2(&p[0], 1 * MiB), CUDA_ERROR_NOT_INITIALIZED);

    use_device0();
    CUdevice dev = 0;

    size_t total_mem;
    CHECK_CU(cuDeviceTotalMem_v2(&total_mem, dev), CUDA_SUCCESS);
    if (limited) CHECK_EQ_U64(total_mem, LIMIT);
    else CHECK(total_mem > LIMIT, "the fake device should be larger than the test limit");
    expect_free(LIMIT);

    /* NULL out-parameters: passed to the driver, which answers. */
    unsigned long info_calls = fakecuda_calls("cuMemGetInfo_v2");
    CHECK_CU(cuMemGetInfo_v2(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_U64(fakecuda_calls("cuMemGetInfo_v2"), info_calls + 1);
    CHECK_CU(cuMemAlloc_v2(NULL, 1 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuDeviceTotalMem_v2(NULL, dev), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAllocPitch_v2(&p[0], NULL, 64, 64, 4), CUDA_ERROR_INVALID_VALUE);

    /* cuMemAlloc_v2 up to and beyond the limit. */
    for (int i = 0; i < 4; i++) CHECK_CU(cuMemAlloc_v2(&p[i], 256 * MiB), CUDA_SUCCESS);
    expect_free(0);
    OVER(cuMemAlloc_v2(&p[4], 256 * MiB), "cuMemAlloc_v2");
    if (!limited) CHECK_CU(cuMemFree_v2(p[4]), CUDA_SUCCESS);
    OVER(cuMemAlloc_v2(&p[4], 1), "cuMemAlloc_v2");
    if (!limited) CHECK_CU(cuMemFree_v2(p[4]), CUDA_SUCCESS);
    CHECK_CU(cuMemFree_v2(p[3]), CUDA_SUCCESS);
    expect_free(256 * MiB);
    /* A free the driver refuses gives nothing back. */
    CHECK_CU(cuMemFree_v2((CUdeviceptr)0xdead000), CUDA_ERROR_INVALID_VALUE);
    expect_free(256 * MiB);

    /* Pitched: estimated before the call, settled on the driver's pitch after it. */
    CUdeviceptr q;
    size_t pitch;
    OVER(cuMemAllocPitch_v2(&q, &pitch, 1 * MiB, 300, 4), "cuMemAllocPitch_v2");
    if (!limited) CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocPitch_v2(&q, &pitch, 1100, 1000, 4), CUDA_SUCCESS);
    expect_free(256 * MiB - (pitch * 1000 + 2 * MiB - 1) / (2 * MiB) * (2 * MiB)); /* whole 2 MiB granules */
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    expect_free(256 * MiB);

    /* Managed. */
    OVER(cuMemAllocManaged(&q, 300 * MiB, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
    if (!limited) CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocManaged(&q, 100 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    expect_free(156 * MiB);
    CHECK_CU(cuMemFree_v2(q), CUDA_SUCCESS);
    expect_free(256 * MiB);

    /* Stream-ordered, legacy and per-thread, default pool and explicit pool. */
    CUmemoryPool pool;
    CHECK_CU(cuDeviceGetDefaultMemPool(&pool, dev), CUDA_SUCCESS);
    OVER(cuMemAllocAsync(&q, 300 * MiB, NULL), "cuMemAllocAsync");
    if (!limited) CHECK_CU(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    OVER(cuMemAllocAsync_ptsz(&q, 300 * MiB, NULL), "cuMemAllocAsync_ptsz");
    if (!limited) CHECK_CU(cuMemFreeAsync_ptsz(q, NULL), CUDA_SUCCESS);
    OVER(cuMemAllocFromPoolAsync(&q, 300 * MiB, pool, NULL), "cuMemAllocFromPoolAsync");
    if (!limited) CHECK_CU(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    OVER(cuMemAllocFromPoolAsync_ptsz(&q, 300 * MiB, pool, NULL), "cuMemAllocFromPoolAsync_ptsz");
    if (!limited) CHECK_CU(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    CUdeviceptr a1, a2, a3, a4;
    CHECK_CU(cuMemAllocAsync(&a1, 50 * MiB, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync_ptsz(&a2, 50 * MiB, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocFromPoolAsync(&a3, 50 * MiB, pool, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocFromPoolAsync_ptsz(&a4, 50 * MiB, pool, NULL), CUDA_SUCCESS);
    expect_free(56 * MiB);
    CHECK_CU(cuMemFreeAsync(a1, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync_ptsz(a2, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(a3, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync_ptsz(a4, NULL), CUDA_SUCCESS);
    /* The pool keeps freed memory until a synchronisation point gives it back (release threshold 0). */
    expect_free(56 * MiB);
    CHECK_CU(cuCtxSynchronize(), CUDA_SUCCESS);
    expect_free(256 * MiB);

    /* Virtual memory management: physical memory on the device counts, on the host it does not. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    OVER(cuMemCreate(&h, 258 * MiB, &prop, 0), "cuMemCreate");
    if (!limited) CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_CU(cuMemCreate(&h, 128 * MiB, &prop, 0), CUDA_SUCCESS);
    expect_free(128 * MiB);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    expect_free(256 * MiB);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    prop.location.id = 0;
    CHECK_CU(cuMemCreate(&h, 512 * MiB, &prop, 0), CUDA_SUCCESS);
    expect_free(256 * MiB);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);

    /* Physical memory lives while its handle is unreleased or mapped. The idiom of llama.cpp's VMM pool and
     * the CUDA samples - map, then release the handle at once - keeps it charged until it is unmapped. */
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h2, h3;
    CHECK_CU(cuMemAddressReserve(&va, 256 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemCreate(&h, 128 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va, 128 * MiB, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    expect_free(128 * MiB);
    CHECK_CU(cuMemCreate(&h2, 128 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va + 128 * MiB, 128 * MiB, 0, h2, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h2), CUDA_SUCCESS);
    expect_free(0);
    OVER(cuMemCreate(&h3, 2 * MiB, &prop, 0), "cuMemCreate");
    if (!limited) CHECK_CU(cuMemRelease(h3), CUDA_SUCCESS);
    /* NCCL's free path: retain the handle behind an address, release it again: nothing changes. */
    CHECK_CU(cuMemRetainAllocationHandle(&h3, (void *)(uintptr_t)(va + 4096)), CUDA_SUCCESS);
    CHECK(h3 == h, "cuMemRetainAllocationHandle returned another handle");
    CHECK_CU(cuMemRelease(h3), CUDA_SUCCESS);
    expect_free(0);
    /* A range that is not whole mappings is refused, and nothing is given back. */
    CHECK_CU(cuMemUnmap(va, 64 * MiB), CUDA_ERROR_INVALID_VALUE);
    expect_free(0);
    /* One unmap over both mappings frees both allocations. */
    CHECK_CU(cuMemUnmap(va, 256 * MiB), CUDA_SUCCESS);
    expect_free(256 * MiB);
    /* PyTorch's order (expandable segments): unmap, then release; a handle mapped twice counts once. */
    CHECK_CU(cuMemCreate(&h, 64 * MiB, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va, 64 * MiB, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(va + 64 * MiB, 64 * MiB, 0, h, 0), CUDA_SUCCESS);
    expect_free(192 * MiB);
    CHECK_CU(cuMemUnmap(va, 128 * MiB), CUDA_SUCCESS);
    expect_free(192 * MiB);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    expect_free(256 * MiB);
    CHECK_CU(cuMemAddressFree(va, 256 * MiB), CUDA_SUCCESS);
    CHECK_EQ_U64(fakecuda_used_bytes(0), 768 * MiB);

    /* Arrays and mipmapped arrays (width x height x depth x element size, summed over levels). */
    CUarray arr;
    CUmipmappedArray mip;
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 16384, .Height = 16384, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    OVER(cuArrayCreate_v2(&arr, &d2), "cuArrayCreate_v2");
    if (!limited) CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    d2.Width = d2.Height = 4096;
    CHECK_CU(cuArrayCreate_v2(&arr, &d2), CUDA_SUCCESS);
    expect_free(192 * MiB);
    CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    expect_free(256 * MiB);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {
        .Width = 512, .Height = 512, .Depth = 512, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    OVER(cuArray3DCreate_v2(&arr, &d3), "cuArray3DCreate_v2");
    if (!limited) CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    d3.Width = d3.Height = d3.Depth = 256;
    CHECK_CU(cuArray3DCreate_v2(&arr, &d3), CUDA_SUCCESS);
    expect_free(192 * MiB);
    CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    /* Sparse and deferred-mapping arrays have no memory of their own (it comes from cuMemCreate). */
    CUDA_ARRAY3D_DESCRIPTOR sparse = {.Width = 1024,
                                      .Height = 1024,
                                      .Depth = 1024,
                                      .Format = CU_AD_FORMAT_FLOAT,
                                      .NumChannels = 1,
                                      .Flags = CUDA_ARRAY3D_SPARSE};
    CHECK_CU(cuArray3DCreate_v2(&arr, &sparse), CUDA_SUCCESS);
    expect_free(256 * MiB);
    CHECK_CU(cuArrayDestroy(arr), CUDA_SUCCESS);
    sparse.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
    CHECK_CU(cuMipmappedArrayCreate(&mip, &sparse, 3), CUDA_SUCCESS);
    expect_free(256 * MiB);
    CHECK_CU(cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 8192, .Height = 8192, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    OVER(cuMipmappedArrayCreate(&mip, &dm, 2), "cuMipmappedArrayCreate");
    if (!limited) CHECK_CU(cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
    dm.Width = dm.Height = 4096;
    CHECK_CU(cuMipmappedArrayCreate(&mip, &dm, 3), CUDA_SUCCESS);
    expect_free(256 * MiB - (64 + 16 + 4) * MiB);
    CHECK_CU(cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
    expect_free(256 * MiB);

    /* Without a compute limit, launches go straight through. */
    CUmodule mod;
    CUfunction fn;
    CHECK_CU(cuModuleLoadData(&mod, "fake image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "kernel"), CUDA_SUCCESS);
    unsigned long launches = fakecuda_calls("cuLaunchKernel");
    CHECK_CU(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ_U64(fakecuda_calls("cuLaunchKernel"), launches + 1);

    for (int i = 0; i < 3; i++) CHECK_CU(cuMemFree_v2(p[i]), CUDA_SUCCESS);
    expect_free(LIMIT);
    CHECK_EQ_U64(fakecuda_used_bytes(0), 0);
    printf("t_linked %s: ok\n", limited ? "limited" : "baseline");
    return 0;
}
