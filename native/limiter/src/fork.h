/* fork.c: what the child of a fork() drops of the parent's memory accounting, and the ledger held around the fork. */
#ifndef DRAGPU_FORK_H
#define DRAGPU_FORK_H

/* Around fork() (init.c registers them): no stripe of the ledger may be held by a thread the child lacks. */
void dl_fork_prepare(void);
void dl_fork_parent(void);
/* In the child: the parent's pools, contexts, live allocations and device facts are not the child's (CUDA contexts
 * do not survive fork). */
void dl_memory_reset_after_fork(void);
/* In the child: the compute limiter's process state (the arbiter's view, the launches being measured, the captures
 * open) is the parent's. */
void dl_throttle_reset_after_fork(void);

#endif
