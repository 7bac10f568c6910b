/* init.c: lazy, thread-safe initialisation on the first intercepted call; fork handling. */
#ifndef DRAGPU_INIT_H
#define DRAGPU_INIT_H

#include "common.h"

extern _Atomic int dl_core_ready; /* 1 once dl_core_init has run in this process (reset by fork) */
void dl_core_init_slow(void);
static inline void dl_core_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_core_ready, memory_order_acquire))) dl_core_init_slow();
}
/* A reset the child of a fork() runs before the library's own (it must not wait for, or call, anything a thread the
 * child lacks may hold): for state of a module below this one (driver.c's load). Registered once per function, by
 * the module itself before it has anything to reset; at most a few. */
typedef void (*dl_fork_reset_fn)(void);
void dl_core_on_fork_child(dl_fork_reset_fn reset);
void dl_uuid_format(const unsigned char bytes[16], char out[DL_UUID_LEN]);

#endif
