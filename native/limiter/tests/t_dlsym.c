/*
 * dlopen + dlsym, the way applications and frameworks reach the driver without linking it: every wrapped
 * name comes back as the limiter's wrapper (whatever the handle, RTLD_NEXT included), names we do not
 * wrap come back as the driver's own, and the limits hold through the returned pointers. Also checks that
 * dlsym(RTLD_NEXT, ...) of unrelated symbols still resolves relative to the real caller.
 */
#include "check.h"

#include "cuda_min.h"

void *next_a_lookup(void);
const char *next_probe(void);

int main(int argc, char **argv) {
    int limited = limited_mode(argc, argv);
    const char *wrapper_owner = limited ? "limiter" : "fake";

    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h, "dlopen(libcuda.so.1): %s", dlerror());

    void *alloc = dlsym(h, "cuMemAlloc_v2");
    CHECK_OWNER(alloc, wrapper_owner, "cuMemAlloc_v2");
    CHECK_OWNER(dlsym(h, "cuGetProcAddress_v2"), wrapper_owner, "cuGetProcAddress_v2");
    CHECK_OWNER(dlsym(h, "cuGetProcAddress"), wrapper_owner, "cuGetProcAddress");
    CHECK_OWNER(dlsym(h, "cuLaunchKernel_ptsz"), wrapper_owner, "cuLaunchKernel_ptsz");
    CHECK_OWNER(dlsym(h, "nvmlDeviceGetMemoryInfo"), "?", "?"); /* not in libcuda */
    CHECK_OWNER(dlsym(h, "cuDeviceGetName"), "fake", "cuDeviceGetName");
    CHECK(dlsym(h, "cuNoSuchFunction") == NULL, "an unknown name must stay unknown");
    CHECK(dlsym(h, "fakecuda_calls") != NULL, "non-driver names pass through");
    if (limited) {
        CHECK_OWNER(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "limiter", "cuMemAlloc_v2");
        CHECK_OWNER(dlsym(RTLD_NEXT, "cuMemAlloc_v2"), "limiter", "cuMemAlloc_v2");
        CHECK_OWNER(dlsym(RTLD_NEXT, "cuMemFreeAsync_ptsz"), "limiter", "cuMemFreeAsync_ptsz");
        /* dlvsym: a wrapped name comes back as the wrapper for RTLD_NEXT and RTLD_DEFAULT, and from a handle
         * where the real lookup finds that version (the driver's symbols have none: nothing, as without us). */
        CHECK_OWNER(dlvsym(RTLD_NEXT, "cuMemAlloc_v2", "ANY_1.0"), "limiter", "cuMemAlloc_v2");
        CHECK_OWNER(dlvsym(RTLD_DEFAULT, "cuLaunchKernel", "ANY_1.0"), "limiter", "cuLaunchKernel");
        CHECK(dlvsym(h, "cuMemAlloc_v2", "ANY_1.0") == NULL, "a version the driver does not define");
        CHECK(dlvsym(RTLD_DEFAULT, "malloc", "GLIBC_2.2.5") != NULL || dlvsym(RTLD_DEFAULT, "malloc", "GLIBC_2.17"),
              "other names pass through to the C library's dlvsym");
        /* The C library's own lookups, asked for by name, are the limiter's: no way around it through them. */
        CHECK_OWNER(dlsym(RTLD_NEXT, "dlsym"), "limiter", "dlsym");
        CHECK_OWNER(dlsym(RTLD_DEFAULT, "dlvsym"), "limiter", "dlvsym");
        CHECK_OWNER(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), "limiter", "dlsym");
        CHECK_OWNER(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"), "limiter", "dlsym");
        void *(*libc_dlsym)(void *, const char *) = (void *(*)(void *, const char *))dlsym(RTLD_NEXT, "dlsym");
        CHECK_OWNER(libc_dlsym(h, "cuMemAlloc_v2"), "limiter", "cuMemAlloc_v2");
    }

    /* RTLD_NEXT for other names: from libnext_a, the next next_probe is libnext_b's. */
    const char *(*next)(void) = (const char *(*)(void))next_a_lookup();
    CHECK(next && strcmp(next(), "b") == 0, "dlsym(RTLD_NEXT) from libnext_a found %s", next ? next() : "nothing");
    CHECK(strcmp(next_probe(), "a") == 0, "global lookup order changed");

    /* Enforcement through the pointers obtained with dlsym. */
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(h, "cuInit");
    CUresult (*get)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult (*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*malloc_)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))alloc;
    CUresult (*info)(size_t *, size_t *) = (CUresult (*)(size_t *, size_t *))dlsym(h, "cuMemGetInfo_v2");
    unsigned long (*calls)(const char *) = (unsigned long (*)(const char *))dlsym(h, "fakecuda_calls");
    CUdevice dev;
    CUcontext ctx;
    CHECK_CU(init(0), CUDA_SUCCESS);
    CHECK_CU(get(&dev, 0), CUDA_SUCCESS);
    CHECK_CU(retain(&ctx, dev), CUDA_SUCCESS);
    CHECK_CU(set(ctx), CUDA_SUCCESS);
    CUdeviceptr p;
    CHECK_CU(malloc_(&p, 768 * MiB), CUDA_SUCCESS);
    unsigned long before = calls("cuMemAlloc_v2");
    CHECK_CU(malloc_(&p, 512 * MiB), limited ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
    CHECK_EQ_U64(calls("cuMemAlloc_v2"), before + (limited ? 0 : 1));
    size_t free_b, total;
    CHECK_CU(info(&free_b, &total), CUDA_SUCCESS);
    if (limited) {
        CHECK_EQ_U64(total, 1 * GiB);
        CHECK_EQ_U64(free_b, 256 * MiB);
    }
    printf("t_dlsym %s: ok\n", limited ? "limited" : "baseline");
    return 0;
}
