/*
 * Reaching the real driver: libcuda.so.1 and libnvidia-ml.so.1, loaded on the first call that needs them, with
 * the real entry points of every name the library wraps (hooks.c routes callers to the wrappers) and of the
 * few it calls itself; and the C library's own dlsym, which dlsym.c's interposer and the loading here use.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "driver.h"
#include "common.h"
#include "libc.h"
#include "log.h"

struct dl_real_cuda dl_cuda;
struct dl_real_nvml dl_nvml;
_Atomic int dl_cuda_ready, dl_nvml_ready;

#define DL_NAME(name, type) #name,
static const char *const cuda_hooked_names[] = {DL_CUDA_HOOKED(DL_NAME)};
static const char *const nvml_hooked_names[] = {DL_NVML_HOOKED(DL_NAME)};
static const char *const cuda_used_names[] = {DL_CUDA_USED(DL_NAME)};
static const char *const nvml_used_names[] = {DL_NVML_USED(DL_NAME)};
#undef DL_NAME
#define N_OF(names) (sizeof names / sizeof names[0])
#define N_CUDA_HOOKS N_OF(cuda_hooked_names)
#define N_NVML_HOOKS N_OF(nvml_hooked_names)
#define N_CUDA_USED N_OF(cuda_used_names)
#define N_NVML_USED N_OF(nvml_used_names)

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

static void *load(const char *soname, const char *const *hooked_names, size_t n_hooks, void **real_hooked, void **used,
                  const char *const *used_names, size_t n_used) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_NODELETE);
    if (!h) {
        dl_warn("cannot load %s: %s", soname, dlerror());
        return NULL;
    }
    dl_dlsym_fn real = dl_real_dlsym();
    for (size_t i = 0; i < n_hooks; i++) {
        real_hooked[i] = real(h, hooked_names[i]);
        if (!real_hooked[i]) dl_debug("%s has no %s", soname, hooked_names[i]);
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
    size_t i = 0;
#define DL_ASSIGN(name, type) dl_cuda.name = (type)r->hooked[i++];
    DL_CUDA_HOOKED(DL_ASSIGN)
#undef DL_ASSIGN
    i = 0;
#define DL_ASSIGN(name, type) dl_cuda.name = (type)r->used[i++];
    DL_CUDA_USED(DL_ASSIGN)
#undef DL_ASSIGN
}

static void copy_nvml(void *arg) {
    const struct nvml_resolved *r = arg;
    size_t i = 0;
#define DL_ASSIGN(name, type) dl_nvml.name = (type)r->hooked[i++];
    DL_NVML_HOOKED(DL_ASSIGN)
#undef DL_ASSIGN
    i = 0;
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

/* Before this process claims a load: a child forked while one is being published must be able to start over, whether
 * or not the rest of the library has initialised (and registered its own handlers) by then. The log level needs no
 * initialisation: log.c settles it from the environment on the first line. */
static void before_load(void) {
    static _Atomic int atfork_registered;
    if (atomic_exchange(&atfork_registered, 1) == 0) pthread_atfork(NULL, NULL, dl_driver_reset_after_fork);
}

void dl_cuda_init_slow(void) {
    if (loading) return;
    before_load();
    loading = 1;
    struct cuda_resolved r;
    memset(&r, 0, sizeof r);
    load("libcuda.so.1", cuda_hooked_names, N_CUDA_HOOKS, r.hooked, r.used, cuda_used_names, N_CUDA_USED);
    publish(&cuda_claimed, &dl_cuda_ready, copy_cuda, &r);
    loading = 0;
}

void dl_nvml_init_slow(void) {
    if (loading) return;
    before_load();
    loading = 1;
    struct nvml_resolved r;
    memset(&r, 0, sizeof r);
    load("libnvidia-ml.so.1", nvml_hooked_names, N_NVML_HOOKS, r.hooked, r.used, nvml_used_names, N_NVML_USED);
    publish(&nvml_claimed, &dl_nvml_ready, copy_nvml, &r);
    loading = 0;
}
