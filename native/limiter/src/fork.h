/*
 * What the child of a fork() drops of the parent's state, and the locks held around the fork: each module that
 * holds such state names its handlers here with DL_FORK_HANDLERS, and fork.c walks them for init.c's atfork
 * handlers. init.c cannot name those modules itself (they call it: dl_core_init), so the list is turned round: a
 * module declares its handlers and fork.c, which names no module, finds them.
 *
 * The declarations are constant data the linker gathers into one section (dl_fork_handlers): nothing runs to
 * register them (the library has no constructor), so none can be missed by a fork, however early, and nothing is
 * locked to register them. Their order is the slot's, not the link's: the child resets the slots in the order of
 * enum dl_fork_slot, which is the order the resets must run in.
 */
#ifndef DRAGPU_FORK_H
#define DRAGPU_FORK_H

/* In the child, after the driver's load and the region (init.c resets those itself), in this order: the memory
 * accounting (the parent's pools, contexts, live allocations and device facts are not the child's: CUDA contexts do
 * not survive fork), then the compute limiter's process state (the arbiter's view, the launches being measured, the
 * captures open). */
enum dl_fork_slot {
    DL_FORK_POOLS,
    DL_FORK_CONTEXTS,
    DL_FORK_LEDGER,
    DL_FORK_DEVICES,
    DL_FORK_ARBITER,
    DL_FORK_MEASURE,
    DL_FORK_CAPTURE,
    DL_FORK_SLOTS
};

/* One module's handlers; any may be NULL. prepare runs before fork() (slots in order), parent after it in the parent
 * (slots in reverse order), child in the child (slots in order, only once the core was initialised). */
struct dl_fork_handlers {
    enum dl_fork_slot slot;
    void (*prepare)(void);
    void (*parent)(void);
    void (*child)(void);
};

/* Declares a module's handlers, once per slot, at file scope: DL_FORK_HANDLERS(DL_FORK_X, prepare, parent, child). */
#define DL_FORK_SECTION __attribute__((used, section("dl_fork_handlers"), aligned(sizeof(void *))))
#define DL_FORK_HANDLERS(slot_, prepare_, parent_, child_)                                                             \
    static const struct dl_fork_handlers dl_fork_handlers_##slot_ DL_FORK_SECTION = {slot_, prepare_, parent_, child_}

/* The walks (init.c registers them with pthread_atfork; the child's runs after the driver's and the region's resets,
 * only once the core was initialised). */
void dl_fork_prepare(void);
void dl_fork_parent(void);
void dl_fork_child(void);

#endif
