/* contexts.c: what contexts reserve (stack, malloc heap, printf FIFO, the context itself). */
#ifndef DRAGPU_CONTEXTS_H
#define DRAGPU_CONTEXTS_H

#include "common.h"

/* A context is charged at most its limits' formula plus this much of what the driver took. */
#define DL_CTX_SLACK (1ull << 30)

#endif
