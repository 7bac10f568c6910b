/* Helper for t_dlsym: an interposer loaded after the limiter that looks up the next definition of its
 * own symbol with dlsym(RTLD_NEXT). glibc searches the objects after the *caller* in the caller's
 * dependency scope (libnext_a, then libnext_b): the answer is libnext_b's only if the limiter's dlsym
 * keeps libnext_a as the caller; seen from the limiter, there is no next_probe at all. */
#define _GNU_SOURCE
#include <dlfcn.h>

const char *next_probe(void) { return "a"; }

/* Not a tail call: the call to dlsym must be made from inside this library. */
void *next_a_lookup(void) {
    void *p = dlsym(RTLD_NEXT, "next_probe");
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}
