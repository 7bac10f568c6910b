/* devices.c: which device a call is about: ordinal -> UUID -> region entry and limit, granularity. */
#ifndef DRAGPU_DEVICES_H
#define DRAGPU_DEVICES_H

#include "common.h"

/* Region device index and limit for a CUDA ordinal (resolved through the UUID once per process). */
int dl_device_for_ordinal(int ordinal, uint64_t *limit);
/* The capped (total, free) view shared by the CUDA and NVML queries. */
void dl_capped_view(int dev, uint64_t limit, uint64_t real_total, uint64_t real_free, uint64_t *total,
                    uint64_t *free_bytes);
/* Bumped whenever a context may be gone (destroyed, reset, released: contexts.c): cached context facts expire. */
extern _Atomic unsigned dl_ctx_epoch;
/* The current context's CUDA ordinal, -1 without one. */
int dl_current_ordinal(void);
/* The CUDA ordinal of a stream's device (the current context's for the NULL and the legacy/per-thread
 * default streams), -1 when neither the stream nor a current context tells it. A stream that is capturing (or
 * may be: a capture is open and cuStreamIsCapturing cannot tell) is never asked - the real driver answers
 * cuStreamGetDevice on a capturing stream with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 * capture -: its ordinal is the current context's. */
int dl_stream_ordinal(CUstream s, int ptsz);
/* Charges rounded up to whole units of the device's allocation granularity. */
uint64_t dl_round_granule(int ordinal, uint64_t bytes);

#endif
