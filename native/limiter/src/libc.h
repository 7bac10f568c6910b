/* libc.c: functions of the C library, found without going through dlsym. */
#ifndef DRAGPU_LIBC_H
#define DRAGPU_LIBC_H

#include "common.h"

/* A function of the C library, from its own symbol table; NULL without one. */
DL_NO_SANITIZE void *dl_libc_function(const char *name);

#endif
