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
#include <sched.h>
#include <string.h>

#include "driver.h"
#include "common.h"
#include "init.h"
#include "libc.h"
#include "log.h"

struct dl_real_cuda dl_cuda;
struct dl_real_nvml dl_nvml;
_Atomic int dl_cuda_ready, dl_nvml_ready;

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

/* The C library's dlsym and dlvsym (libc.c: a reference from here would bind to the library's own). */
static _Atomic(dl_dlsym_fn) real_dlsym_fn;
static _Atomic(dl_dlvsym_fn) real_dlvsym_fn;

DL_NO_SANITIZE dl_dlvsym_fn dl_real_dlvsym(void) {
    dl_dlvsym_fn f = atomic_load_explicit(&real_dlvsym_fn, memory_order_acquire);
    if (DL_LIKELY(f)) return f;
    f = (dl_dlvsym_fn)dl_libc_function("dlvsym");
    atomic_store_explicit(&real_dlvsym_fn, f, memory_order_release);
    return f;
}

DL_NO_SANITIZE dl_dlsym_fn dl_real_dlsym(void) {
    dl_dlsym_fn f = atomic_load_explicit(&real_dlsym_fn, memory_order_acquire);
    if (DL_LIKELY(f)) return f;
    f = (dl_dlsym_fn)dl_libc_function("dlsym");
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

static void *load(const char *soname, const struct hook *hooks, size_t n_hooks, void **real_hooked, void **used,
                  const char *const *used_names, size_t n_used) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_NODELETE);
    if (!h) {
        dl_warn("cannot load %s: %s", soname, dlerror());
        return NULL;
    }
    dl_dlsym_fn real = dl_real_dlsym();
    for (size_t i = 0; i < n_hooks; i++) {
        real_hooked[i] = real(h, hooks[i].name);
        if (!real_hooked[i]) dl_debug("%s has no %s", soname, hooks[i].name);
    }
    for (size_t i = 0; i < n_used; i++) used[i] = real(h, used_names[i]);
    return h;
}

/* Set while this thread loads a library: should its constructors call back into a wrapper, that call
 * must not wait for the load it is part of (it sees the entry points still unresolved instead). */
static __thread int loading;

/* No lock is held across the dynamic loader (a library constructor that calls a wrapper from another
 * thread while this one waits for the loader's lock would deadlock): every thread that finds the driver
 * unresolved resolves it itself (dlopen and dlsym are idempotent), and the first one to finish
 * publishes; the others wait only for that copy to complete, which takes no lock. */
static void publish(_Atomic int *claimed, _Atomic int *ready, void (*copy)(void *), void *arg) {
    int expected = 0;
    if (atomic_compare_exchange_strong(claimed, &expected, 1)) {
        copy(arg);
        atomic_store_explicit(ready, 1, memory_order_release);
        return;
    }
    while (!atomic_load_explicit(ready, memory_order_acquire)) sched_yield();
}

#define DL_NAME(name, type) #name,
static const char *const cuda_used_names[] = {DL_CUDA_USED(DL_NAME)};
static const char *const nvml_used_names[] = {DL_NVML_USED(DL_NAME)};
#undef DL_NAME
#define N_CUDA_USED (sizeof cuda_used_names / sizeof cuda_used_names[0])
#define N_NVML_USED (sizeof nvml_used_names / sizeof nvml_used_names[0])

struct cuda_resolved {
    void *hooked[N_CUDA_HOOKS];
    void *used[N_CUDA_USED];
};
struct nvml_resolved {
    void *hooked[N_NVML_HOOKS];
    void *used[N_NVML_USED];
};

static void copy_cuda(void *arg) {
    const struct cuda_resolved *r = arg;
    for (size_t i = 0; i < N_CUDA_HOOKS; i++) *cuda_hooks[i].real = r->hooked[i];
    size_t i = 0;
#define DL_ASSIGN(name, type) dl_cuda.name = (type)r->used[i++];
    DL_CUDA_USED(DL_ASSIGN)
#undef DL_ASSIGN
}

static void copy_nvml(void *arg) {
    const struct nvml_resolved *r = arg;
    for (size_t i = 0; i < N_NVML_HOOKS; i++) *nvml_hooks[i].real = r->hooked[i];
    size_t i = 0;
#define DL_ASSIGN(name, type) dl_nvml.name = (type)r->used[i++];
    DL_NVML_USED(DL_ASSIGN)
#undef DL_ASSIGN
}

static _Atomic int cuda_claimed, nvml_claimed;

/* A fork() while another thread was publishing: the child (which has no such thread) resolves again. */
void dl_driver_reset_after_fork(void) {
    if (!atomic_load(&dl_cuda_ready)) atomic_store(&cuda_claimed, 0);
    if (!atomic_load(&dl_nvml_ready)) atomic_store(&nvml_claimed, 0);
}

void dl_cuda_init_slow(void) {
    if (loading) return;
    dl_core_init(); /* log level first */
    loading = 1;
    struct cuda_resolved r;
    memset(&r, 0, sizeof r);
    load("libcuda.so.1", cuda_hooks, N_CUDA_HOOKS, r.hooked, r.used, cuda_used_names, N_CUDA_USED);
    publish(&cuda_claimed, &dl_cuda_ready, copy_cuda, &r);
    loading = 0;
}

void dl_nvml_init_slow(void) {
    if (loading) return;
    dl_core_init();
    loading = 1;
    struct nvml_resolved r;
    memset(&r, 0, sizeof r);
    load("libnvidia-ml.so.1", nvml_hooks, N_NVML_HOOKS, r.hooked, r.used, nvml_used_names, N_NVML_USED);
    publish(&nvml_claimed, &dl_nvml_ready, copy_nvml, &r);
    loading = 0;
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
