/* ledger.c: what each live allocation charged (a striped table), and the charge and refund of it. */
#ifndef DRAGPU_LEDGER_H
#define DRAGPU_LEDGER_H

#include "common.h"

/* Records that other modules keep in the ledger's table of live allocations: a key of a kind, with a device,
 * bytes and one more value; put replaces, take removes and reports (0 if absent). */
enum {
    DL_REC_POOLPTR = 16,
    DL_REC_GRAPH = 17,
    DL_REC_EXEC = 18,
    DL_REC_CAPTURE = 19,
    DL_REC_CTX = 20,
    DL_REC_IMPORT = 21,
    DL_REC_IPC = 22
};
void dl_rec_put(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t aux);
int dl_rec_take(unsigned kind, uint64_t key, int *dev, uint64_t *bytes, uint64_t *aux);
/* Charges bytes, rounded up to the device's allocation granularity, to a device: CUDA_ERROR_OUT_OF_MEMORY over
 * the limit (after pools.c gave back what the driver no longer holds). An unknown device is not charged: the
 * driver will answer the call with its own error. */
struct dl_charge {
    int dev;
    uint64_t bytes;
};
CUresult dl_charge(int ordinal, uint64_t bytes, struct dl_charge *c);
/* What a charge settles first (pools.c's: it registers before it first holds memory to give back): whether there is
 * anything, and giving back on a device what the driver no longer holds. */
struct dl_reclaimer {
    bool (*active)(void);
    void (*reclaim)(int ordinal);
};
void dl_charge_reclaimer(const struct dl_reclaimer *r);
void dl_refund(const struct dl_charge *c);
/* A charge kept when the driver call succeeded (remembered under key), refunded when it failed. */
void dl_settle(CUresult r, unsigned kind, uint64_t key, const struct dl_charge *c);
/* The ledger's entries: the kinds of memory.c and ipc.c. */
/* K_MAP: a mapping made by cuMemMap, keyed by its address: bytes is its size, handle what it maps (0 when
 * the handle is not one we charged). */
enum kind { K_PTR = 1, K_HANDLE = 2, K_ARRAY = 3, K_MIPMAP = 4, K_MAP = 5 }; /* DL_REC_* follow */

struct entry {
    uint64_t key; /* 0 = empty */
    uint64_t bytes;
    uint64_t handle; /* K_MAP: the handle mapped; K_PTR, K_HANDLE: the export entry + 1 (see release) */
    uint32_t refs;   /* K_HANDLE: the driver's references to the allocation that we have seen */
    int16_t dev;
    uint8_t kind;
    uint8_t tomb;
};
/* Gives a charge back: to the claim's total, or (shared != 0: the export table's entry + 1) by ending this
 * process's hold on memory shared within the claim. */
void dl_release_charge(int dev, uint64_t bytes, uint64_t shared);
/* Remembers a charge; an entry left behind for the same key (a free we did not see) is refunded. */
void dl_track_shared(unsigned kind, uint64_t key, int dev, uint64_t bytes, uint64_t shared);
void dl_track(unsigned kind, uint64_t key, int dev, uint64_t bytes);
/* Looks an entry up under its stripe's lock and applies op (which returns 1 to delete it); the entry as it
 * was goes to *out. Returns whether it was found. */
int dl_update(unsigned kind, uint64_t key, int (*op)(struct entry *), struct entry *out);
/* Puts an entry in (an entry of the same key and kind is replaced and copied to *old); -1 without memory. */
int dl_insert(const struct entry *e, struct entry *old);
int dl_op_delete(struct entry *e);
int dl_op_ref(struct entry *e);
int dl_op_unref(struct entry *e);
/* Forgets a charge and reports it (*shared: as for dl_release_charge); 0 bytes if the key is unknown. */
uint64_t dl_untrack(unsigned kind, uint64_t key, int *dev, uint64_t *shared);
/* A reference to a charged VMM handle (0 if it is not one we charged); dropping one returns the bytes to
 * refund when it was the last (*known: whether we charged the handle); the undo restores it. */
int dl_handle_ref(uint64_t handle);
uint64_t dl_handle_unref(uint64_t handle, int *dev, int *known, uint64_t *shared);
void dl_handle_unref_undo(uint64_t handle, int known, int dev, uint64_t bytes, uint64_t shared);

#endif
