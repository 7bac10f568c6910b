/* Facts about the real driver that the fake models and the limiter's memory accounting relies on; run on a
 * GPU node without the limiter. Build: cc -std=c11 -I$CUDA/include driver_facts.c -L$CUDA/lib64/stubs -lcuda
 * Prints key=value lines:
 *   ctx_delta      free-memory drop when a second context is created (what a context takes)
 *   ctx_formula    stack x SMs x threads per SM + heap + FIFO of that context (what the limiter charged)
 *   ipc_same       whether two cuIpcGetMemHandle of one allocation return the same 64 bytes
 *   ipc_nonzero    how many of the 64 bytes are not zero
 *   vmm_new_handle whether importing one's own export returns another handle
 *   vmm_kept       bytes still held after the original handle is released, the import unmapped
 *   vmm_partial_map whether cuMemMap accepts a size smaller than the allocation (a size probe would need it) */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define OK(call)                                                               \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS) {                                              \
            printf("error=%s:%d:%d\n", #call, __LINE__, (int)r_);              \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static size_t free_now(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}

int main(void) {
    CUdevice dev;
    CUcontext primary, second;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&primary, dev));
    OK(cuCtxSetCurrent(primary));
    size_t before = free_now();
    OK(cuCtxCreate(&second, NULL, 0, dev));
    size_t after = free_now();
    size_t stack = 0, heap = 0, fifo = 0;
    int sms = 0, threads = 0;
    cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE);
    cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE);
    cuCtxGetLimit(&fifo, CU_LIMIT_PRINTF_FIFO_SIZE);
    cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
    printf("ctx_delta=%zu\nctx_formula=%llu\n", before - after,
           (unsigned long long)stack * (unsigned long long)sms * (unsigned long long)threads + heap + fifo);
    OK(cuCtxDestroy(second));
    OK(cuCtxSetCurrent(primary));

    CUdeviceptr p;
    CUipcMemHandle h1, h2;
    OK(cuMemAlloc(&p, 64u << 20));
    OK(cuIpcGetMemHandle(&h1, p));
    OK(cuIpcGetMemHandle(&h2, p));
    int nonzero = 0;
    for (size_t i = 0; i < sizeof h1.reserved; i++) nonzero += h1.reserved[i] != 0;
    printf("ipc_same=%d\nipc_nonzero=%d\n", memcmp(&h1, &h2, sizeof h1) == 0, nonzero);
    OK(cuMemFree(p));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0, size = 256u << 20;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t base = free_now();
    CUmemGenericAllocationHandle own, imported;
    int fd = -1;
    OK(cuMemCreate(&own, size, &prop, 0));
    OK(cuMemExportToShareableHandle(&fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    OK(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    printf("vmm_new_handle=%d\n", imported != own);
    OK(cuMemRelease(own));
    printf("vmm_kept=%zu\n", base - free_now());
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CUresult m = cuMemMap(va, gran, 0, imported, 0);
    printf("vmm_partial_map=%d\n", m == CUDA_SUCCESS);
    if (m == CUDA_SUCCESS) cuMemUnmap(va, gran);
    cuMemAddressFree(va, size);
    OK(cuMemRelease(imported));
    printf("vmm_after_release=%zu\n", base - free_now());
    return 0;
}
