/* driver.c: the real libcuda/libnvidia-ml: the entry points the library wraps (their wrappers are declared here,
 * hooks.c routes to them) or calls itself, loaded on first use; the C library's dlsym. */
#ifndef DRAGPU_DRIVER_H
#define DRAGPU_DRIVER_H

#include "common.h"

/* Real driver entry points: hooked ones plus the few the limiter calls itself. */
#define DL_CUDA_HOOKED(X)                                                                                              \
    X(cuGetProcAddress, PFN_cuGetProcAddress_v11030)                                                                   \
    X(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000)                                                                \
    X(cuMemAlloc_v2, PFN_cuMemAlloc_v3020)                                                                             \
    X(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020)                                                                   \
    X(cuMemAllocManaged, PFN_cuMemAllocManaged_v6000)                                                                  \
    X(cuMemFree_v2, PFN_cuMemFree_v3020)                                                                               \
    X(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)                                                                     \
    X(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz)                                                           \
    X(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)                                                     \
    X(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)                                           \
    X(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                                                                       \
    X(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz)                                                             \
    X(cuMemCreate, PFN_cuMemCreate_v10020)                                                                             \
    X(cuMemRelease, PFN_cuMemRelease_v10020)                                                                           \
    X(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)                                             \
    X(cuMemMap, PFN_cuMemMap_v10020)                                                                                   \
    X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                                                               \
    X(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020)                                       \
    X(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020)                                           \
    X(cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010)                                                                  \
    X(cuIpcOpenMemHandle, PFN_cuIpcOpenMemHandle_v4010)                                                                \
    X(cuIpcOpenMemHandle_v2, PFN_cuIpcOpenMemHandle_v11000)                                                            \
    X(cuIpcCloseMemHandle, PFN_cuIpcCloseMemHandle_v4010)                                                              \
    X(cuArrayCreate_v2, PFN_cuArrayCreate_v3020)                                                                       \
    X(cuArray3DCreate_v2, PFN_cuArray3DCreate_v3020)                                                                   \
    X(cuArrayDestroy, PFN_cuArrayDestroy_v2000)                                                                        \
    X(cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000)                                                        \
    X(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000)                                                      \
    X(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020)                                                                         \
    X(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020)                                                                 \
    X(cuMemAlloc, PFN_cuMemAlloc_v2000)                                                                                \
    X(cuMemAllocPitch, PFN_cuMemAllocPitch_v2000)                                                                      \
    X(cuMemFree, PFN_cuMemFree_v2000)                                                                                  \
    X(cuMemGetInfo, PFN_cuMemGetInfo_v2000)                                                                            \
    X(cuDeviceTotalMem, PFN_cuDeviceTotalMem_v2000)                                                                    \
    X(cuArrayCreate, PFN_cuArrayCreate_v2000)                                                                          \
    X(cuArray3DCreate, PFN_cuArray3DCreate_v2000)                                                                      \
    X(cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020)                                                                     \
    X(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)                                                         \
    X(cuMemPoolDestroy, PFN_cuMemPoolDestroy_v11020)                                                                   \
    X(cuGraphAddMemAllocNode, PFN_cuGraphAddMemAllocNode_v11040)                                                       \
    X(cuGraphAddNode, PFN_cuGraphAddNode_v12020)                                                                       \
    X(cuGraphAddNode_v2, PFN_cuGraphAddNode_v12030)                                                                    \
    X(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040)                                             \
    X(cuGraphInstantiate, PFN_cuGraphInstantiate_v10000)                                                               \
    X(cuGraphInstantiate_v2, PFN_cuGraphInstantiate_v11000)                                                            \
    X(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000)                                           \
    X(cuGraphInstantiateWithParams_ptsz, PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                 \
    X(cuGraphUpload, PFN_cuGraphUpload_v11010)                                                                         \
    X(cuGraphUpload_ptsz, PFN_cuGraphUpload_v11010_ptsz)                                                               \
    X(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000)                                                               \
    X(cuGraphDestroy, PFN_cuGraphDestroy_v10000)                                                                       \
    X(cuDeviceGraphMemTrim, PFN_cuDeviceGraphMemTrim_v11040)                                                           \
    X(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)                                                    \
    X(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000)                                              \
    X(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000)                                                  \
    X(cuCtxCreate_v2, PFN_cuCtxCreate_v3020)                                                                           \
    X(cuCtxCreate_v3, PFN_cuCtxCreate_v11040)                                                                          \
    X(cuCtxCreate_v4, PFN_cuCtxCreate_v12050)                                                                          \
    X(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000)                                                                         \
    X(cuCtxSetLimit, PFN_cuCtxSetLimit_v3010)                                                                          \
    X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                                                              \
    X(cuStreamSynchronize_ptsz, PFN_cuStreamSynchronize_v7000_ptsz)                                                    \
    X(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)                                                                    \
    X(cuCtxSynchronize_v2, PFN_cuCtxSynchronize_v13000)                                                                \
    X(cuEventSynchronize, PFN_cuEventSynchronize_v2000)                                                                \
    X(cuCtxCreate, PFN_cuCtxCreate_v2000)                                                                              \
    X(cuCtxDestroy, PFN_cuCtxDestroy_v2000)                                                                            \
    X(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v7000)                                                  \
    X(cuDevicePrimaryCtxReset, PFN_cuDevicePrimaryCtxReset_v7000)                                                      \
    X(cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                                                        \
    X(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz)                                                              \
    X(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060)                                                                   \
    X(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz)                                                         \
    X(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000)                                                  \
    X(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz)                                        \
    X(cuGraphLaunch, PFN_cuGraphLaunch_v10000)                                                                         \
    X(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz)                                                               \
    X(cuLaunch, PFN_cuLaunch_v2000)                                                                                    \
    X(cuLaunchGrid, PFN_cuLaunchGrid_v2000)                                                                            \
    X(cuLaunchGridAsync, PFN_cuLaunchGridAsync_v2000)                                                                  \
    X(cuLaunchCooperativeKernelMultiDevice, PFN_cuLaunchCooperativeKernelMultiDevice_v9000)                            \
    X(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000)                                                           \
    X(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz)                                                 \
    X(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010)                                                        \
    X(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz)                                              \
    X(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030)                                             \
    X(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz)                                   \
    X(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000)                                                               \
    X(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz)

#define DL_CUDA_USED(X)                                                                                                \
    X(cuInit, PFN_cuInit_v2000)                                                                                        \
    X(cuDeviceGet, PFN_cuDeviceGet_v2000)                                                                              \
    X(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000)                                                                    \
    X(cuDeviceGetUuid_v2, PFN_cuDeviceGetUuid_v11040)                                                                  \
    X(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000)                                                                        \
    X(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000)                                                                      \
    X(cuEventCreate, PFN_cuEventCreate_v2000)                                                                          \
    X(cuEventRecord, PFN_cuEventRecord_v2000)                                                                          \
    X(cuEventRecord_ptsz, PFN_cuEventRecord_v7000_ptsz)                                                                \
    X(cuEventQuery, PFN_cuEventQuery_v2000)                                                                            \
    X(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000)                                                                \
    X(cuEventElapsedTime_v2, PFN_cuEventElapsedTime_v12080)                                                            \
    X(cuEventDestroy_v2, PFN_cuEventDestroy_v4000)                                                                     \
    X(cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000)                                                             \
    X(cuStreamIsCapturing_ptsz, PFN_cuStreamIsCapturing_v10000_ptsz)                                                   \
    X(cuCtxGetLimit, PFN_cuCtxGetLimit_v3010)                                                                          \
    X(cuMemGetAllocationPropertiesFromHandle, PFN_cuMemGetAllocationPropertiesFromHandle_v10020)                       \
    X(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                                                            \
    X(cuStreamGetDevice, PFN_cuStreamGetDevice_v12080)                                                                 \
    X(cuStreamGetDevice_ptsz, PFN_cuStreamGetDevice_v12080_ptsz)                                                       \
    X(cuStreamGetCtx, PFN_cuStreamGetCtx_v9020)                                                                        \
    X(cuStreamGetCtx_ptsz, PFN_cuStreamGetCtx_v9020_ptsz)                                                              \
    X(cuCtxPushCurrent_v2, PFN_cuCtxPushCurrent_v4000)                                                                 \
    X(cuCtxPopCurrent_v2, PFN_cuCtxPopCurrent_v4000)                                                                   \
    X(cuThreadExchangeStreamCaptureMode, PFN_cuThreadExchangeStreamCaptureMode_v10010)                                 \
    X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020)                                         \
    X(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                                                          \
    X(cuDeviceGetMemPool, PFN_cuDeviceGetMemPool_v11020)                                                               \
    X(cuMemPoolGetAttribute, PFN_cuMemPoolGetAttribute_v11020)                                                         \
    X(cuDeviceGetGraphMemAttribute, PFN_cuDeviceGetGraphMemAttribute_v11040)

#define DL_NVML_HOOKED(X)                                                                                              \
    X(nvmlDeviceGetMemoryInfo, dl_pfn_nvmlDeviceGetMemoryInfo)                                                         \
    X(nvmlDeviceGetMemoryInfo_v2, dl_pfn_nvmlDeviceGetMemoryInfo_v2)

#define DL_NVML_USED(X)                                                                                                \
    X(nvmlDeviceGetUUID, dl_pfn_nvmlDeviceGetUUID)                                                                     \
    X(nvmlInit_v2, dl_pfn_nvmlInit_v2)                                                                                 \
    X(nvmlShutdown, dl_pfn_nvmlShutdown)                                                                               \
    X(nvmlDeviceGetHandleByUUID, dl_pfn_nvmlDeviceGetHandleByUUID)

/* Our wrappers, exported under the driver's exact names: each defined by the module of its job (memory.c,
 * launch.c, ...), all named in hooks.c's table. */
#define DL_DECLARE(name, type) DL_EXPORT extern __typeof__(*(type)0) name;
DL_CUDA_HOOKED(DL_DECLARE)
DL_NVML_HOOKED(DL_DECLARE)
#undef DL_DECLARE

struct dl_real_cuda {
#define DL_FIELD(name, type) type name;
    DL_CUDA_HOOKED(DL_FIELD)
    DL_CUDA_USED(DL_FIELD)
};
struct dl_real_nvml {
    DL_NVML_HOOKED(DL_FIELD)
    DL_NVML_USED(DL_FIELD)
#undef DL_FIELD
};

/* The C library's dlsym (never our interposer). */
typedef void *(*dl_dlsym_fn)(void *, const char *);
DL_NO_SANITIZE dl_dlsym_fn dl_real_dlsym(void);
typedef void *(*dl_dlvsym_fn)(void *, const char *, const char *);
DL_NO_SANITIZE dl_dlvsym_fn dl_real_dlvsym(void);

extern struct dl_real_cuda dl_cuda; /* valid after dl_cuda_init() */
extern struct dl_real_nvml dl_nvml; /* valid after dl_nvml_init() */
extern _Atomic int dl_cuda_ready, dl_nvml_ready;
void dl_cuda_init_slow(void);
void dl_nvml_init_slow(void);
static inline void dl_cuda_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_cuda_ready, memory_order_acquire))) dl_cuda_init_slow();
}
static inline void dl_nvml_init(void) {
    if (DL_UNLIKELY(!atomic_load_explicit(&dl_nvml_ready, memory_order_acquire))) dl_nvml_init_slow();
}
/* In the child of a fork(): a load another thread of the parent was publishing starts over. It must run before
 * anything else of the child's resets (it waits for nothing and calls nothing): driver.c registers it with the C
 * library before its first load, and init.c's child handler calls it first too; running twice is harmless. */
void dl_driver_reset_after_fork(void);

#endif
