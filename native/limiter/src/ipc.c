/*
 * Memory shared with other processes of the claim, charged once: legacy IPC handles (cuIpcGetMemHandle /
 * cuIpcOpenMemHandle) and VMM shareable handles (export, import, retain, map, unmap). region.c keeps the
 * claim-wide export table; a joining process holds the exporter's charge instead of paying again.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "devices.h"
#include "driver.h"
#include "init.h"
#include "ledger.h"
#include "log.h"
#include "region.h"

#define current_ordinal dl_current_ordinal

#define REAL_OR_NOT_FOUND(name)                                                                                        \
    dl_cuda_init();                                                                                                    \
    if (!dl_cuda.name) return CUDA_ERROR_NOT_FOUND

/* ---- memory shared with other processes of the claim: charged once (region.c, the export table) ---- */

static int op_keep(struct entry *e) {
    (void)e;
    return 0;
}

/* Moves the charge of an allocation this process exports into the claim's export table; whether the entry
 * took it (exported again: an IPC handle is the same, a descriptor is added to the entry). */
static bool export_charge(unsigned kind, uint64_t key, const struct dl_export_key *k) {
    struct entry e, old;
    if (!dl_update(kind, key, op_keep, &e) || !e.bytes) return false;
    if (e.handle) return k->kind == DL_EXPORT_FD && dl_region_export_again(e.dev, (int)e.handle - 1, k->fd) == 0;
    int idx = dl_region_export(e.dev, k, e.bytes);
    if (idx < 0) return false;
    /* A free racing the export (the application's own bug) found the entry gone and refunded nothing: the
     * entry goes again at once, and this process's own count keeps the bytes until it exits. */
    if (!dl_update(kind, key, dl_op_delete, &e)) {
        dl_region_leave(e.dev, idx, 0);
        return true;
    }
    e.handle = (uint64_t)idx + 1;
    if (dl_insert(&e, &old) != 0) dl_release_charge(e.dev, e.bytes, e.handle);
    return true;
}

/* Joins the entry of memory another process of the claim exported; its bytes are held by this process
 * alone (counted against the limit in its own memory). -1 when it is not such memory. */
static int join_export(int ordinal, const struct dl_export_key *k, uint64_t *bytes, int *dev) {
    uint64_t limit;
    dl_core_init();
    *dev = dl_device_for_ordinal(ordinal, &limit);
    return *dev < 0 ? -1 : dl_region_join(*dev, k, bytes, limit);
}

/* An imported allocation (another process's, through a shareable handle) is charged to the importer's claim
 * when it first maps it (the driver tells no size before): a handle of this process's own allocation is
 * already charged, and importing it only takes a reference, as the driver counts it. */
DL_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
    REAL_OR_NOT_FOUND(cuMemImportFromShareableHandle);
    CUresult r = dl_cuda.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS || !handle || dl_handle_ref(*handle)) return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if (!dl_cuda.cuMemGetAllocationPropertiesFromHandle ||
        dl_cuda.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) != CUDA_SUCCESS) {
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; /* cannot tell: charge it where it is mapped from */
        prop.location.id = current_ordinal();
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return r;
    if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        /* Exported by a process of this claim: held from the import on, as the driver keeps it. */
        struct dl_export_key k;
        dl_export_key_fd(&k, (int)(intptr_t)osHandle);
        uint64_t bytes = 0;
        int dev, idx = join_export(prop.location.id, &k, &bytes, &dev);
        if (idx >= 0) {
            dl_track_shared(K_HANDLE, *handle, dev, bytes, (uint64_t)idx + 1);
            return r;
        }
        /* Not proven to be one of the claim's exports (kcmp refused, another PID namespace), yet it may be:
         * the driver keeps it for this handle whatever the exporter releases, so it is charged now, as the
         * largest allocation the claim exports there - fail closed: the claim may pay twice, never not at
         * all. The driver tells no size before a mapping; memory of no export of the claim is charged then. */
        bytes = dev >= 0 ? dl_region_exported_most(dev) : 0;
        if (bytes) {
            struct dl_charge c;
            if (dl_charge(prop.location.id, bytes, &c) != CUDA_SUCCESS) {
                (void)dl_cuda.cuMemRelease(*handle);
                *handle = 0;
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            dl_track(K_HANDLE, *handle, c.dev, c.bytes);
            return r;
        }
    }
    dl_rec_put(DL_REC_IMPORT, *handle, -1, 0, (uint64_t)(unsigned)prop.location.id);
    return r;
}

/* Legacy CUDA IPC: memory another process exported with cuIpcGetMemHandle, opened here, is charged to this
 * process's claim on the device it is opened on (the driver tells its size only once it is open: over the
 * limit it is closed again and refused), unless a process of the same claim exported it (then it is held,
 * not charged again). Opening a handle already open returns the same pointer with one more reference, as
 * the driver counts it; the last cuIpcCloseMemHandle refunds. The record's aux: the references in the low
 * 32 bits, the export entry + 1 above them. */
#define IPC_REFS(aux) ((aux) & 0xffffffffu)
#define IPC_SHARED(aux) ((aux) >> 32)
static CUresult ipc_opened(CUresult r, CUdeviceptr *pdptr, const CUipcMemHandle *handle) {
    if (r != CUDA_SUCCESS || !pdptr || !*pdptr) return r;
    int dev;
    uint64_t bytes, aux;
    if (dl_rec_take(DL_REC_IPC, *pdptr, &dev, &bytes, &aux)) {
        dl_rec_put(DL_REC_IPC, *pdptr, dev, bytes, aux + 1);
        return r;
    }
    size_t size = 0;
    int ordinal = -1;
    if (!dl_cuda.cuPointerGetAttribute ||
        dl_cuda.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, *pdptr) != CUDA_SUCCESS ||
        dl_cuda.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, *pdptr) != CUDA_SUCCESS ||
        size == 0) {
        ordinal = current_ordinal();
        size = 0;
    }
    struct dl_charge c;
    if (size == 0) {
        /* Cannot tell what it holds: err on the side of the limit. */
        uint64_t limit = DL_NO_LIMIT;
        dl_core_init();
        if (ordinal >= 0 && dl_device_for_ordinal(ordinal, &limit) >= 0 && limit != DL_NO_LIMIT) {
            dl_error("cannot tell the size of CUDA IPC memory opened at %#llx; refusing it",
                     (unsigned long long)*pdptr);
            (void)dl_cuda.cuIpcCloseMemHandle(*pdptr);
            *pdptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        return r;
    }
    struct dl_export_key k;
    memset(&k, 0, sizeof k);
    k.kind = DL_EXPORT_IPC;
    memcpy(k.key, handle->reserved, sizeof k.key);
    uint64_t held = dl_round_granule(ordinal, size);
    int idx = join_export(ordinal, &k, &held, &dev);
    if (idx >= 0) {
        dl_rec_put(DL_REC_IPC, *pdptr, dev, held, 1 | ((uint64_t)idx + 1) << 32);
        return r;
    }
    if (dl_charge(ordinal, size, &c) != CUDA_SUCCESS) {
        (void)dl_cuda.cuIpcCloseMemHandle(*pdptr);
        *pdptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dl_rec_put(DL_REC_IPC, *pdptr, c.dev, c.bytes, 1);
    return r;
}

DL_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    REAL_OR_NOT_FOUND(cuIpcOpenMemHandle);
    if (!dl_cuda.cuIpcCloseMemHandle) return CUDA_ERROR_NOT_FOUND;
    return ipc_opened(dl_cuda.cuIpcOpenMemHandle(pdptr, handle, Flags), pdptr, &handle);
}
DL_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    REAL_OR_NOT_FOUND(cuIpcOpenMemHandle_v2);
    if (!dl_cuda.cuIpcCloseMemHandle) return CUDA_ERROR_NOT_FOUND;
    return ipc_opened(dl_cuda.cuIpcOpenMemHandle_v2(pdptr, handle, Flags), pdptr, &handle);
}

DL_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuIpcCloseMemHandle);
    int dev = -1;
    uint64_t bytes = 0, aux = 0;
    int known = dptr && dl_rec_take(DL_REC_IPC, dptr, &dev, &bytes, &aux);
    CUresult r = dl_cuda.cuIpcCloseMemHandle(dptr);
    if (!known) return r;
    if (r != CUDA_SUCCESS) dl_rec_put(DL_REC_IPC, dptr, dev, bytes, aux);
    else if (IPC_REFS(aux) > 1) dl_rec_put(DL_REC_IPC, dptr, dev, bytes, aux - 1);
    else if (bytes) dl_release_charge(dev, bytes, IPC_SHARED(aux));
    return r;
}

DL_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    REAL_OR_NOT_FOUND(cuIpcGetMemHandle);
    CUresult r = dl_cuda.cuIpcGetMemHandle(pHandle, dptr);
    if (r == CUDA_SUCCESS && pHandle && dptr) {
        struct dl_export_key k;
        memset(&k, 0, sizeof k);
        k.kind = DL_EXPORT_IPC;
        memcpy(k.key, pHandle->reserved, sizeof k.key);
        (void)export_charge(K_PTR, dptr, &k);
    }
    return r;
}

DL_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuMemExportToShareableHandle);
    CUresult r = dl_cuda.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
    if (r != CUDA_SUCCESS || !shareableHandle || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return r;
    /* Our own descriptor of the same open file description, for importers to be compared with (kcmp): the
     * application's may be closed as soon as it is sent. Kept while this process holds the memory. */
    int kept = fcntl(*(int *)shareableHandle, F_DUPFD_CLOEXEC, 0);
    if (kept < 0) return r;
    struct dl_export_key k;
    dl_export_key_fd(&k, kept);
    if (!export_charge(K_HANDLE, handle, &k)) close(kept);
    return r;
}

DL_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    REAL_OR_NOT_FOUND(cuMemRetainAllocationHandle);
    CUresult r = dl_cuda.cuMemRetainAllocationHandle(handle, addr);
    /* The driver returns the very handle value that was mapped there. */
    if (r == CUDA_SUCCESS && handle) dl_handle_ref(*handle);
    return r;
}

DL_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    REAL_OR_NOT_FOUND(cuMemMap);
    /* The first mapping of an imported allocation charges it (refused over the limit). */
    uint64_t imported_ordinal;
    struct dl_charge ic = {.dev = -1, .bytes = 0};
    int imported = handle && size && dl_rec_take(DL_REC_IMPORT, handle, NULL, NULL, &imported_ordinal);
    if (imported) {
        CUresult a = dl_charge((int)imported_ordinal, size, &ic);
        if (a != CUDA_SUCCESS) {
            dl_rec_put(DL_REC_IMPORT, handle, -1, 0, imported_ordinal);
            return a;
        }
    }
    CUresult r = dl_cuda.cuMemMap(ptr, size, offset, handle, flags);
    if (imported) {
        if (r != CUDA_SUCCESS) {
            dl_refund(&ic);
            dl_rec_put(DL_REC_IMPORT, handle, -1, 0, imported_ordinal);
        } else {
            dl_track(K_HANDLE, handle, ic.dev, ic.bytes); /* the import's own reference */
        }
    }
    if (r != CUDA_SUCCESS || !ptr || size == 0) return r;
    /* Mappings of handles we did not charge are remembered too (handle 0), so that an unmap spanning
     * several mappings can walk them all. */
    struct entry old, e = {.key = ptr, .bytes = size, .handle = dl_handle_ref(handle) ? handle : 0, .kind = K_MAP};
    /* Not remembered (no memory): this mapping's reference goes; replaced: the driver mapped over an old
     * one, which is therefore gone (an unmap we did not see), and so is its reference. */
    uint64_t drop = dl_insert(&e, &old) != 0 ? e.handle : old.kind ? old.handle : 0;
    int dev = -1, known;
    uint64_t shared = 0, bytes = dl_handle_unref(drop, &dev, &known, &shared);
    if (bytes) dl_release_charge(dev, bytes, shared);
    return r;
}

/* What cuMemUnmap took apart before the driver call, to put back if the driver refuses. */
struct unmapped {
    struct entry map;
    int known, dev;
    uint64_t bytes; /* refund due: the mapping held the handle's last reference */
    uint64_t shared;
};

DL_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REAL_OR_NOT_FOUND(cuMemUnmap);
    /* The range covers whole mappings, back to back (the driver refuses anything else): walk them. */
    struct unmapped *list = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t va = ptr; ptr && va - ptr < size;) {
        struct entry m;
        if (!dl_update(K_MAP, va, dl_op_delete, &m)) break;
        if (n == cap) {
            struct unmapped *grown = realloc(list, (cap = cap ? cap * 2 : 8) * sizeof *list);
            if (!grown) {
                struct entry old;
                (void)dl_insert(&m, &old);
                break;
            }
            list = grown;
        }
        struct unmapped *u = &list[n++];
        u->map = m;
        u->dev = -1;
        u->shared = 0;
        u->bytes = dl_handle_unref(m.handle, &u->dev, &u->known, &u->shared);
        va += m.bytes;
    }
    CUresult r = dl_cuda.cuMemUnmap(ptr, size);
    /* Backwards when undoing: a handle mapped twice in the range comes back before it is referenced. */
    for (size_t k = 0; k < n; k++) {
        struct unmapped *u = &list[r == CUDA_SUCCESS ? k : n - 1 - k];
        if (r == CUDA_SUCCESS) {
            if (u->bytes) dl_release_charge(u->dev, u->bytes, u->shared);
        } else {
            struct entry old;
            dl_handle_unref_undo(u->map.handle, u->known, u->dev, u->bytes, u->shared);
            (void)dl_insert(&u->map, &old);
        }
    }
    free(list);
    return r;
}

/* Bytes per element of an array format (channels included where the format fixes them); block
 * compressed formats are rounded up to a byte per texel, and unknown formats count 16. */
