/* hooks.c: the table of the library's wrappers (driver.h declares them; each is defined by the module of its job:
 * memory.c, launch.c, ...), the lookup of them by name, and cuGetProcAddress routing. */
#ifndef DRAGPU_HOOKS_H
#define DRAGPU_HOOKS_H

#include "common.h"

/* The wrapper with exactly this exported name, or NULL if we wrap none. */
DL_NO_SANITIZE void *dl_cuda_wrapper(const char *name);
DL_NO_SANITIZE void *dl_nvml_wrapper(const char *name);

#endif
