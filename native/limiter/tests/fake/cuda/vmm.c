/*
 * Virtual memory management: physical allocations (cuMemCreate), address reservations, mappings and the
 * references that keep a handle's memory (its own, retains, mappings, and an open descriptor it was exported
 * as), shareable handles (POSIX file descriptors) and the allocation granularity (2 MiB).
 */
#define _GNU_SOURCE
#include "fake_cuda.h"
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t next_handle = 1;

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!h || !prop || size == 0 || flags != 0 || size % (2u << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
    int device = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        device = prop->location.id;
    }
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    uint64_t key = next_handle++;
    if (device >= 0) {
        if (size > G.memory - devices[device].used) r = CUDA_ERROR_OUT_OF_MEMORY;
        else devices[device].used += size;
    }
    if (r == CUDA_SUCCESS) {
        alloc_put((struct alloc){.key = key,
                                 .bytes = device < 0 ? 0 : size,
                                 .device = device < 0 ? 0 : device,
                                 .kind = A_HANDLE,
                                 .size = size,
                                 .refs = 1});
        *h = key;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* Shareable handles (POSIX file descriptors): the descriptor is a memfd naming the allocation (the exporting
 * process, its handle, device and size). Imported in the exporting process, it is the same allocation
 * (the real driver returns a new handle per import, even here: one more reference to the allocation, held
 * until the new handle is released and unmapped); imported in another process, this fake accounts the allocation's memory to the
 * importing process's device as well, from its first mapping there (handle = 1 until then), so that each
 * process's view holds what it uses. */
struct shared_alloc {
    int pid;
    uint64_t handle;
    int device;
    uint64_t size;
};

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                             unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    struct shared_alloc sa = {getpid(), h, a ? a->device : 0, a ? a->size : 0};
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fake-cuda-shareable", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct stat st;
    if (write(fd, &sa, sizeof sa) != (ssize_t)sizeof sa || fstat(fd, &st) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&mu);
    a = alloc_find(h, A_HANDLE);
    for (int i = 0; a && i < 4; i++)
        if (!a->fd_ino[i]) {
            a->fd_dev = (uint64_t)st.st_dev;
            a->fd_ino[i] = (uint64_t)st.st_ino;
            break;
        }
    pthread_mutex_unlock(&mu);
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                               CUmemAllocationHandleType type) {
    COUNT();
    CHECK(0);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    struct shared_alloc sa;
    int fd = (int)(intptr_t)os_handle;
    if (pread(fd, &sa, sizeof sa, 0) != (ssize_t)sizeof sa) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(sa.device)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    struct alloc *a = sa.pid == getpid() ? alloc_find(sa.handle, A_HANDLE) : NULL;
    if (a) {
        a->refs++;
        uint64_t key = next_handle++;
        if (alloc_put((struct alloc){
                .key = key, .device = sa.device, .kind = A_HANDLE, .size = sa.size, .refs = 1, .alias = sa.handle}) !=
            0) {
            alloc_find(sa.handle, A_HANDLE)->refs--;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *h = key;
        }
    } else if (sa.pid == getpid()) {
        r = CUDA_ERROR_INVALID_VALUE; /* released since */
    } else {
        uint64_t key = next_handle++;
        alloc_put((struct alloc){
            .key = key, .bytes = 0, .device = sa.device, .kind = A_HANDLE, .size = sa.size, .refs = 1, .handle = 1});
        *h = key;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    COUNT();
    CHECK(0);
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    int device = a ? a->device : 0, on_device = a && (a->bytes || a->handle == 1 || a->alias);
    pthread_mutex_unlock(&mu);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = on_device ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    prop->location.id = on_device ? device : 0;
    return CUDA_SUCCESS;
}

/* Whether this process still has a descriptor the allocation was exported as open: as the real driver (the
 * H100 record's vmm.after_release_all), such a descriptor keeps the memory after the last handle is released. */
static int descriptor_open(const struct alloc *a) {
    if (!a->fd_ino[0]) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int open_ = 0;
    struct dirent *e;
    while (!open_ && (e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || (uint64_t)st.st_dev != a->fd_dev) continue;
        for (int i = 0; i < 4; i++)
            if (a->fd_ino[i] && (uint64_t)st.st_ino == a->fd_ino[i]) open_ = 1;
    }
    closedir(d);
    return open_;
}

/* Frees a handle's memory once nothing refers to it any more. Caller holds mu. */
static void handle_settle(struct alloc *a) {
    if (a->refs > 0 || a->maps > 0) return;
    if (descriptor_open(a)) {
        a->fd_held = 1;
        return;
    }
    a->fd_held = 0;
    devices[a->device].used -= a->bytes;
    a->kind = -1;
    struct alloc *of = a->alias ? alloc_find(a->alias, A_HANDLE) : NULL;
    if (of) {
        of->refs--;
        handle_settle(of);
    }
}

/* Allocations kept only by a descriptor go once it is closed (the fake notices when asked). Caller holds mu. */
void settle_descriptors(void) {
    size_t i = 0;
    for (struct alloc *a; (a = alloc_next(&i, A_HANDLE)) != NULL;)
        if (a->fd_held) handle_settle(a);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    COUNT();
    CHECK(0);
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    CUresult r = a && a->refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        a->refs--;
        handle_settle(a);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static uint64_t next_va = 0x600000000000ull;

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    COUNT();
    CHECK(0);
    (void)alignment;
    (void)addr;
    if (!ptr || size == 0 || flags != 0 || size % (2u << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *ptr = (CUdeviceptr)next_va;
    next_va += size + (2u << 20); /* a guard gap: reservations never touch */
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    COUNT();
    CHECK(0);
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    COUNT();
    CHECK(0);
    if (!ptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct alloc *a = alloc_find(h, A_HANDLE);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->refs == 0 || offset > a->size || size > a->size - offset || alloc_find(ptr, A_MAP))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && alloc_put((struct alloc){.key = ptr, .bytes = size, .kind = A_MAP, .handle = h}) != 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        a = alloc_find(h, A_HANDLE); /* found again: the insert may have rehashed */
        a->maps++;
        if (a->handle == 1) { /* imported from another process: its memory counts here from now on */
            a->handle = 0;
            a->bytes = a->size;
            devices[a->device].used += a->size;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* The range must be whole mappings, back to back; anything else is refused and nothing is unmapped. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    COUNT();
    CHECK(0);
    pthread_mutex_lock(&mu);
    uint64_t va = ptr;
    while (va - ptr < size) {
        struct alloc *m = alloc_find(va, A_MAP);
        if (!m) break;
        va += m->bytes;
    }
    CUresult r = ptr && size && va - ptr == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (va = ptr; r == CUDA_SUCCESS && va - ptr < size;) {
        struct alloc *m = alloc_find(va, A_MAP);
        struct alloc *a = alloc_find(m->handle, A_HANDLE);
        va += m->bytes;
        m->kind = -1;
        a->maps--;
        handle_settle(a);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    COUNT();
    CHECK(0);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    size_t i = 0;
    for (struct alloc *m; (m = alloc_next(&i, A_MAP)) != NULL;) {
        if ((uint64_t)(uintptr_t)addr - m->key >= m->bytes) continue;
        alloc_find(m->handle, A_HANDLE)->refs++;
        *h = m->handle;
        r = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    COUNT();
    CHECK(0);
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULE;
    return CUDA_SUCCESS;
}
