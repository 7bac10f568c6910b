/*
 * The dlsym interposer. Kept apart from <dlfcn.h>, whose declaration marks `name` nonnull.
 *
 * For the exact names we wrap, dlsym returns our wrapper whatever the handle (RTLD_NEXT included, so
 * it cannot be used to step around the limiter) - but only where the real lookup would have found the
 * symbol, so a program probing an older driver still sees what it lacks. Every other name goes to the
 * C library's dlsym as a tail call: glibc resolves RTLD_NEXT relative to its caller's return address,
 * which a tail call leaves pointing at the original caller (tests/t_dlsym.c checks this).
 *
 * dlvsym is interposed the same way (a symbol of an object without versions matches any version asked for,
 * so dlvsym(RTLD_NEXT, "cuMemAlloc_v2", "x") would find the driver's), and both return themselves when asked
 * for "dlsym" or "dlvsym": the C library's own lookup functions cannot be reached around the limiter that way.
 *
 * Nothing here initialises the limiter: returning a pointer has no side effects; the wrapper
 * initialises on its first call. Not sanitizer-instrumented: the sanitizer runtimes call dlsym while
 * they start up.
 */
#define _GNU_SOURCE
#include "common.h"
#include "driver.h"
#include "hooks.h"

#define DL_RTLD_NEXT ((void *)-1l)
#define DL_RTLD_DEFAULT ((void *)0)

DL_EXPORT void *dlsym(void *handle, const char *name);
DL_EXPORT void *dlvsym(void *handle, const char *name, const char *version);

DL_NO_SANITIZE static void *wrapped(void *handle, const char *name, void *wrapper) {
    if (handle == DL_RTLD_NEXT || handle == DL_RTLD_DEFAULT) return wrapper;
    return dl_real_dlsym()(handle, name) ? wrapper : NULL;
}

/* The wrapper of a driver or NVML name, or this file's dlsym / dlvsym for those names; NULL otherwise. */
DL_NO_SANITIZE static void *ours(const char *name) {
    if (!name) return NULL;
    if (name[0] == 'c' && name[1] == 'u') return dl_cuda_wrapper(name);
    if (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') return dl_nvml_wrapper(name);
    if (name[0] == 'd' && name[1] == 'l' && name[2] == 's' && name[3] == 'y' && name[4] == 'm' && !name[5])
        return (void *)dlsym;
    if (name[0] == 'd' && name[1] == 'l' && name[2] == 'v' && name[3] == 's' && name[4] == 'y' && name[5] == 'm' &&
        !name[6])
        return (void *)dlvsym;
    return NULL;
}

DL_NO_SANITIZE __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *handle, const char *name) {
    void *w = ours(name);
    if (w) return wrapped(handle, name, w);
    return dl_real_dlsym()(handle, name);
}

DL_NO_SANITIZE __attribute__((optimize("optimize-sibling-calls"))) void *dlvsym(void *handle, const char *name,
                                                                                const char *version) {
    dl_dlvsym_fn real = dl_real_dlvsym();
    void *w = ours(name);
    if (w) {
        if (handle == DL_RTLD_NEXT || handle == DL_RTLD_DEFAULT) return w;
        return real && real(handle, name, version) ? w : NULL;
    }
    if (!real) return NULL; /* no C library of ours to ask (not glibc): nothing is found */
    return real(handle, name, version);
}
