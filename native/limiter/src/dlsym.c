/*
 * The dlsym interposer. Kept apart from <dlfcn.h>, whose declaration marks `name` nonnull.
 *
 * For the exact names we wrap, dlsym returns our wrapper whatever the handle (RTLD_NEXT included, so
 * it cannot be used to step around the limiter) - but only where the real lookup would have found the
 * symbol, so a program probing an older driver still sees what it lacks. Every other name goes to the
 * C library's dlsym as a tail call: glibc resolves RTLD_NEXT relative to its caller's return address,
 * which a tail call leaves pointing at the original caller (tests/t_dlsym.c checks this).
 *
 * Nothing here initialises the limiter: returning a pointer has no side effects; the wrapper
 * initialises on its first call. Not sanitizer-instrumented: the sanitizer runtimes call dlsym while
 * they start up.
 */
#define _GNU_SOURCE
#include "limiter.h"

#define DL_RTLD_NEXT ((void *)-1l)
#define DL_RTLD_DEFAULT ((void *)0)

DL_EXPORT void *dlsym(void *handle, const char *name);

DL_NO_SANITIZE static void *wrapped(void *handle, const char *name, void *wrapper) {
    if (handle == DL_RTLD_NEXT || handle == DL_RTLD_DEFAULT) return wrapper;
    return dl_real_dlsym()(handle, name) ? wrapper : NULL;
}

DL_NO_SANITIZE __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *handle, const char *name) {
    if (name && name[0] == 'c' && name[1] == 'u') {
        void *w = dl_cuda_wrapper(name);
        if (w) return wrapped(handle, name, w);
    } else if (name && name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') {
        void *w = dl_nvml_wrapper(name);
        if (w) return wrapped(handle, name, w);
    }
    return dl_real_dlsym()(handle, name);
}
