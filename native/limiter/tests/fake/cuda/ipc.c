/*
 * Legacy CUDA IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle) for memory from cuMemAlloc: the
 * handle names the exporting process, the address there, its device and size. Opened in another process, this
 * fake accounts the memory to the importing process's device as well (as for shareable handles, vmm.c), until
 * its last cuIpcCloseMemHandle; opening a handle already open returns the same address with one more
 * reference; the exporting process cannot open its own handle.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <string.h>
#include <unistd.h>

struct ipc_handle {
    uint64_t magic;
    int pid;
    int device;
    uint64_t addr;
    uint64_t bytes;
};
#define IPC_MAGIC 0x4350496b616b6646ull

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    COUNT();
    CHECK(1);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(p, A_DEVICE);
    struct ipc_handle ih = {IPC_MAGIC, getpid(), a ? a->device : 0, p, a ? a->bytes : 0};
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &ih, sizeof ih);
    return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    CHECK(1);
    if (!p || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle ih;
    memcpy(&ih, h.reserved, sizeof ih);
    if (ih.magic != IPC_MAGIC || !valid_device(ih.device)) return CUDA_ERROR_INVALID_HANDLE;
    if (ih.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    struct alloc *open = NULL;
    size_t i = 0;
    for (struct alloc *a; !open && (a = alloc_next(&i, A_IPC)) != NULL;)
        if (a->size == (uint64_t)ih.pid && a->handle == ih.addr) open = a;
    if (open) {
        open->refs++;
        *p = open->key;
    } else {
        uint64_t addr = new_addr(ih.device, ih.bytes, 0);
        if (alloc_put((struct alloc){.key = addr,
                                     .bytes = ih.bytes,
                                     .device = ih.device,
                                     .kind = A_IPC,
                                     .size = (uint64_t)ih.pid,
                                     .handle = ih.addr,
                                     .refs = 1}) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            devices[ih.device].used += ih.bytes;
            *p = addr;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    COUNT();
    return ipc_open(p, h, flags);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    COUNT();
    return ipc_open(p, h, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    COUNT();
    CHECK(1);
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(p, A_IPC);
    if (a && --a->refs == 0) {
        devices[a->device].used -= a->bytes;
        a->kind = -1;
    }
    pthread_mutex_unlock(&mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
