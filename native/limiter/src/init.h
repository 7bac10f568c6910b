/* init.c: lazy, thread-safe initialisation on the first intercepted call; fork handling. */
#ifndef DRAGPU_INIT_H
#define DRAGPU_INIT_H

#include "common.h"

extern _Atomic int dl_core_ready; /* 1 once dl_core_init has run in this process (reset by fork) */
void dl_core_init_slow(void);
static inline void dl_core_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_core_ready, memory_order_acquire))) dl_core_init_slow();
}
void dl_uuid_format(const unsigned char bytes[16], char out[DL_UUID_LEN]);

#endif
