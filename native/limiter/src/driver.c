/*
 * Reaching the real driver, and making every route to the driver end in our wrappers.
 *
 * Routes: (1) programs linked with -lcuda bind to our exported wrappers (a preloaded object comes first
 * in the global lookup order); (2) dlsym(handle, "cuX") is interposed in dlsym.c; (3) the CUDA runtime
 * resolves nearly everything through cuGetProcAddress_v2 by base name and ABI version. For (3) we ask
 * the real resolver and map the pointer it returns back to the exact driver symbol it belongs to
 * (pointer routing): the wrapper of that exact symbol (cuLaunchKernel vs cuLaunchKernel_ptsz,
 * cuGetProcAddress vs cuGetProcAddress_v2, ...) replaces it, so the caller always receives the ABI the
 * driver chose. Pointers of symbols we do not wrap come back unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "limiter.h"

struct dl_real_cuda dl_cuda;
struct dl_real_nvml dl_nvml;
_Atomic int dl_cuda_ready, dl_nvml_ready;
static pthread_mutex_t cuda_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t nvml_mu = PTHREAD_MUTEX_INITIALIZER;

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

static _Atomic(dl_dlsym_fn) real_dlsym_fn;

DL_NO_SANITIZE dl_dlsym_fn dl_real_dlsym(void) {
    dl_dlsym_fn f = atomic_load_explicit(&real_dlsym_fn, memory_order_acquire);
    if (DL_LIKELY(f)) return f;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; !f && i < sizeof versions / sizeof versions[0]; i++)
        f = (dl_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    atomic_store_explicit(&real_dlsym_fn, f, memory_order_release);
    return f;
}

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

static void *load(const char *soname, const struct hook *hooks, size_t n_hooks, void **used,
                  const char *const *used_names, size_t n_used) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_NODELETE);
    if (!h) {
        dl_warn("cannot load %s: %s", soname, dlerror());
        return NULL;
    }
    dl_dlsym_fn real = dl_real_dlsym();
    for (size_t i = 0; i < n_hooks; i++) {
        *hooks[i].real = real(h, hooks[i].name);
        if (!*hooks[i].real) dl_debug("%s has no %s", soname, hooks[i].name);
    }
    for (size_t i = 0; i < n_used; i++) used[i] = real(h, used_names[i]);
    return h;
}

/* Set while this thread loads a library: should its constructors call back into a wrapper, that call
 * must not wait for the load it is part of (it sees the entry points still unresolved instead). */
static __thread int loading;

void dl_cuda_init_slow(void) {
    if (loading) return;
    dl_core_init();  /* log level first */
    loading = 1;
    pthread_mutex_lock(&cuda_mu);
    if (!atomic_load_explicit(&dl_cuda_ready, memory_order_relaxed)) {
#define DL_NAME(name, type) #name,
        static const char *const used_names[] = {DL_CUDA_USED(DL_NAME)};
#undef DL_NAME
        void *used[sizeof used_names / sizeof used_names[0]];
        memset(used, 0, sizeof used);
        load("libcuda.so.1", cuda_hooks, N_CUDA_HOOKS, used, used_names, sizeof used / sizeof used[0]);
        size_t i = 0;
#define DL_ASSIGN(name, type) dl_cuda.name = (type)used[i++];
        DL_CUDA_USED(DL_ASSIGN)
#undef DL_ASSIGN
        atomic_store_explicit(&dl_cuda_ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&cuda_mu);
    loading = 0;
}

void dl_nvml_init_slow(void) {
    if (loading) return;
    dl_core_init();
    loading = 1;
    pthread_mutex_lock(&nvml_mu);
    if (!atomic_load_explicit(&dl_nvml_ready, memory_order_relaxed)) {
#define DL_NAME(name, type) #name,
        static const char *const used_names[] = {DL_NVML_USED(DL_NAME)};
#undef DL_NAME
        void *used[sizeof used_names / sizeof used_names[0]];
        memset(used, 0, sizeof used);
        load("libnvidia-ml.so.1", nvml_hooks, N_NVML_HOOKS, used, used_names, sizeof used / sizeof used[0]);
        size_t i = 0;
#define DL_ASSIGN(name, type) dl_nvml.name = (type)used[i++];
        DL_NVML_USED(DL_ASSIGN)
#undef DL_ASSIGN
        atomic_store_explicit(&dl_nvml_ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&nvml_mu);
    loading = 0;
}

/* A fork while another thread loads a library must not leave the child with a held mutex. */
void dl_driver_before_fork(void) {
    pthread_mutex_lock(&cuda_mu);
    pthread_mutex_lock(&nvml_mu);
}

void dl_driver_after_fork(int child) {
    if (child) {
        pthread_mutex_init(&cuda_mu, NULL);
        pthread_mutex_init(&nvml_mu, NULL);
    } else {
        pthread_mutex_unlock(&nvml_mu);
        pthread_mutex_unlock(&cuda_mu);
    }
}

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
    dl_debug("cuGetProcAddress(%s, %d, %llu) -> %s", symbol ? symbol : "(null)", version,
             (unsigned long long)flags, found->name);
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
