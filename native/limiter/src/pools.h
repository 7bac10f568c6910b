/* pools.c: memory the driver keeps for the process beyond live allocations (pools, graph memory). */
#ifndef DRAGPU_POOLS_H
#define DRAGPU_POOLS_H

#include "common.h"
#include "ledger.h"

/* Pools the process allocates from, and the graph memory pool of each device, are charged what the driver
 * reports they reserve. Gives back what the driver no longer holds on a device. */
void dl_pools_reclaim(int ordinal);
/* Whether the process has any pool or graph memory charged (then a refusal is worth a reclaim first). */
bool dl_pools_active(void);
/* A stream-ordered allocation (pool NULL: the stream's device's current pool). */
CUresult dl_ordered_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s, int ptsz,
                          CUresult (*call)(CUdeviceptr *, size_t, CUmemoryPool, CUstream, int));
/* Frees of pointers with no charge of their own: a pool's allocation (its pool is settled after the free)
 * or a graph's (the graph memory pools are). */
struct dl_pool_free {
    CUdeviceptr ptr;
    int known, dev;
    uint64_t bytes, pool;
};
void dl_pools_before_free(CUdeviceptr p, struct dl_pool_free *f);
void dl_pools_after_free(const struct dl_pool_free *f, CUresult r);
/* Capture bookkeeping: a capture's graph allocations move to the graph it produces. */
void dl_graphmem_capture_ended(CUstream s, CUgraph g);
/* Graph launches and uploads: the first of an executable graph with allocation nodes is charged what the
 * graph memory pool grows by. */
extern _Atomic int dl_graphmem_pending;
struct dl_graph_ticket {
    int n;
    struct dl_charge c[4];
    int ordinal[4];
    uint64_t bytes[4]; /* the graph's allocations on that device */
};
CUresult dl_graphmem_before_launch(CUgraphExec g, struct dl_graph_ticket *t);
void dl_graphmem_after_launch(CUgraphExec g, CUresult r, struct dl_graph_ticket *t);

#endif
