/*
 * Making every route to the driver end in our wrappers.
 *
 * Routes: (1) programs linked with -lcuda bind to our exported wrappers (a preloaded object comes first
 * in the global lookup order); (2) dlsym(handle, "cuX") is interposed in dlsym.c, which asks this file for
 * the wrapper of a name; (3) the CUDA runtime resolves nearly everything through cuGetProcAddress_v2 by base
 * name and ABI version. For (3) we ask the real resolver and map the pointer it returns back to the exact
 * driver symbol it belongs to (pointer routing): the wrapper of that exact symbol (cuLaunchKernel vs
 * cuLaunchKernel_ptsz, cuGetProcAddress vs cuGetProcAddress_v2, ...) replaces it, so the caller always
 * receives the ABI the driver chose. Pointers of symbols we do not wrap come back unchanged.
 *
 * This file sits above every module that defines a wrapper (its table names them all); driver.c, below them,
 * only reaches the real driver.
 */
#define _GNU_SOURCE
#include <string.h>

#include "hooks.h"
#include "common.h"
#include "driver.h"
#include "log.h"

struct hook {
    const char *name;
    void *wrapper;
    void **real;
};

#define DL_HOOK_ENTRY(name, type) {#name, (void *)name, (void **)&dl_cuda.name},
static const struct hook cuda_hooks[] = {DL_CUDA_HOOKED(DL_HOOK_ENTRY)};
#undef DL_HOOK_ENTRY
#define DL_HOOK_ENTRY(name, type) {#name, (void *)name, (void **)&dl_nvml.name},
static const struct hook nvml_hooks[] = {DL_NVML_HOOKED(DL_HOOK_ENTRY)};
#undef DL_HOOK_ENTRY
#define N_CUDA_HOOKS (sizeof cuda_hooks / sizeof cuda_hooks[0])
#define N_NVML_HOOKS (sizeof nvml_hooks / sizeof nvml_hooks[0])

/* A plain loop, not strcmp: the sanitizers intercept strcmp, and this runs during their start-up. */
DL_NO_SANITIZE static void *find_wrapper(const struct hook *hooks, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        const char *a = hooks[i].name, *b = name;
        while (*a && *a == *b) a++, b++;
        if (*a == *b) return hooks[i].wrapper;
    }
    return NULL;
}

DL_NO_SANITIZE void *dl_cuda_wrapper(const char *name) { return find_wrapper(cuda_hooks, N_CUDA_HOOKS, name); }
DL_NO_SANITIZE void *dl_nvml_wrapper(const char *name) { return find_wrapper(nvml_hooks, N_NVML_HOOKS, name); }

/* Maps a pointer returned by the real resolver to our wrapper of the same exact symbol. Should a driver
 * alias two variants to one address, the variant matching the requested stream semantics wins. */
static void *route(void *p, const char *symbol, int version, cuuint64_t flags) {
    if (!p) return p;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct hook *found = NULL;
    for (size_t i = 0; i < N_CUDA_HOOKS; i++) {
        if (*cuda_hooks[i].real != p) continue;
        found = &cuda_hooks[i];
        if ((strstr(found->name, "_ptsz") != NULL) == want_ptsz) break;
    }
    if (!found) return p;
    dl_debug("cuGetProcAddress(%s, %d, %llu) -> %s", symbol ? symbol : "(null)", version, (unsigned long long)flags,
             found->name);
    return found->wrapper;
}

DL_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    dl_cuda_init();
    if (!dl_cuda.cuGetProcAddress_v2) return CUDA_ERROR_NOT_FOUND;
    CUresult r = dl_cuda.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn) *pfn = route(*pfn, symbol, cudaVersion, flags);
    return r;
}

DL_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    dl_cuda_init();
    if (!dl_cuda.cuGetProcAddress) return CUDA_ERROR_NOT_FOUND;
    CUresult r = dl_cuda.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = route(*pfn, symbol, cudaVersion, flags);
    return r;
}
