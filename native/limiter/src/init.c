/*
 * Lazy initialisation. The library has no constructor: it is preloaded into every process of a
 * container (shells and tools included) and must cost nothing there. The first intercepted call that
 * needs the configuration reads the claims' limits files and the environment once and opens the regions;
 * later calls see dl_core_ready with one acquire load.
 *
 * No mutex is held while initialising (it reads files and waits, bounded, for file locks): one thread
 * wins a compare-and-swap and initialises, the others poll until it is done. A fork() in the middle
 * leaves the child to start over.
 *
 * fork(): the child inherits the parent's region locks and counters, which are not its own. The atfork
 * child handler drops them; the child initialises again on its next limited call. Around the fork the
 * ledger's locks are held by the forking thread, so none is left taken by a thread the child lacks.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "init.h"
#include "admission.h"
#include "claim_limits.h"
#include "common.h"
#include "config.h"
#include "driver.h"
#include "fork.h"
#include "log.h"
#include "region.h"

extern char **environ;

/* The release of dra-gpu this library belongs to (the Makefile passes it from the Python package's version). */
static const char release[] = "dragpu-limiter release " DL_RELEASE;

_Atomic int dl_core_ready;
static _Atomic int init_started;
static _Atomic int atfork_registered;
static __thread int initialising;

static void after_fork_child(void) {
    dl_driver_reset_after_fork(); /* first: the driver's load, below everything reset here */
    if (atomic_load(&init_started)) {
        dl_region_reset_after_fork();
        dl_fork_child();
        atomic_store(&dl_core_ready, 0);
        atomic_store(&init_started, 0);
    }
}

static void initialise(void) {
    /* First: a fork() in the middle of what follows must leave the child able to start over. */
    if (atomic_exchange(&atfork_registered, 1) == 0) pthread_atfork(dl_fork_prepare, dl_fork_parent, after_fork_child);
    dl_config_load(&dl_cfg, environ);
    dl_log_level = dl_cfg.log_level;
    dl_claims_load(&dl_claims, dl_claims_root());
    if (dl_limits_from_files() && dl_cfg.state_dir[0])
        dl_debug("DRAGPU_LIMITER_STATE_DIR applies only to devices of no claim with a limits file");
    dl_region_open(dl_cfg.state_dir[0] ? dl_cfg.state_dir : NULL);
    dl_throttle_configure(dl_effective_cores());
    dl_debug("%s initialised: %d claim(s) with limits files, %s environment region, cores %d%%", release, dl_claims.n,
             dl_region_is_shared() ? "shared" : "private", dl_effective_cores());
}

void dl_core_init_slow(void) {
    if (initialising) return; /* a call made by the initialisation itself */
    int expected = 0;
    if (atomic_compare_exchange_strong(&init_started, &expected, 1)) {
        initialising = 1;
        initialise();
        initialising = 0;
        atomic_store_explicit(&dl_core_ready, 1, memory_order_release);
        return;
    }
    /* Another thread initialises; its work is bounded (file reads, bounded lock waits). */
    while (!atomic_load_explicit(&dl_core_ready, memory_order_acquire)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

void dl_uuid_format(const unsigned char b[16], char out[DL_UUID_LEN]) {
    snprintf(out, DL_UUID_LEN, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}
