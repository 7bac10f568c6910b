/*
 * fork(): the walk over the handlers the modules declare (fork.h), slot by slot. init.c registers these with
 * pthread_atfork on first initialisation; this file names no module, so any module may declare handlers.
 */
#include "fork.h"

/* The handlers the modules declare, gathered by the linker into one section (weak: a link of none has none). */
extern const struct dl_fork_handlers __start_dl_fork_handlers[] __attribute__((weak, visibility("hidden")));
extern const struct dl_fork_handlers __stop_dl_fork_handlers[] __attribute__((weak, visibility("hidden")));

enum phase { PREPARE, PARENT, CHILD };

static void run_slot(int slot, enum phase phase) {
    for (const struct dl_fork_handlers *h = __start_dl_fork_handlers; h < __stop_dl_fork_handlers; h++) {
        if ((int)h->slot != slot) continue;
        void (*f)(void) = phase == PREPARE ? h->prepare : phase == PARENT ? h->parent : h->child;
        if (f) f();
    }
}

void dl_fork_prepare(void) {
    for (int slot = 0; slot < DL_FORK_SLOTS; slot++) run_slot(slot, PREPARE);
}

void dl_fork_parent(void) {
    for (int slot = DL_FORK_SLOTS - 1; slot >= 0; slot--) run_slot(slot, PARENT);
}

void dl_fork_child(void) {
    for (int slot = 0; slot < DL_FORK_SLOTS; slot++) run_slot(slot, CHILD);
}
