/*
 * fork(): the memory accounting the child must not inherit. init.c's fork handlers call these. init.c cannot name
 * the modules reset here itself, nor can one of them name the others: they call init.c (dl_core_init) and the
 * ledger, so this file, which nothing below calls, names them all.
 */
#include "fork.h"
#include "arbiter.h"
#include "capture.h"
#include "contexts.h"
#include "devices.h"
#include "ledger.h"
#include "measure.h"
#include "pools.h"

void dl_fork_prepare(void) { dl_ledger_before_fork(); }

void dl_fork_parent(void) { dl_ledger_after_fork_parent(); }

void dl_memory_reset_after_fork(void) {
    dl_pools_reset_after_fork();
    dl_contexts_reset_after_fork();
    dl_ledger_reset_after_fork();
    dl_devices_reset_after_fork();
}

void dl_throttle_reset_after_fork(void) {
    dl_arbiter_reset_after_fork();
    dl_measure_reset_after_fork();
    dl_capture_reset_after_fork();
}
