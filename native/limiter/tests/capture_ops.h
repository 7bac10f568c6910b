/*
 * The operations whose behaviour inside a stream capture the real driver's record lists
 * (tests/real-gpu/driver-facts.cu prints `capture.[other_thread.]MODE.NAME=call/end` for each), in the record's
 * order, and which of them the fake driver implements. t_capture.c checks the fake against the record with the
 * same table, so the two programs cannot drift apart.
 *
 *   X(id, "name in the record", the fake implements it)
 */
#ifndef LIMITER_TEST_CAPTURE_OPS_H
#define LIMITER_TEST_CAPTURE_OPS_H

#define CAPTURE_OPS(X)                                                                                                 \
    X(MEM_GET_INFO, "cuMemGetInfo", 1)                                                                                 \
    X(MEM_ALLOC, "cuMemAlloc", 1)                                                                                      \
    X(MEM_FREE, "cuMemFree", 1)                                                                                        \
    X(CTX_SYNCHRONIZE, "cuCtxSynchronize", 1)                                                                          \
    X(STREAM_QUERY_CAPTURING, "cuStreamQuery.capturing", 1)                                                            \
    X(STREAM_QUERY_LEGACY, "cuStreamQuery.legacy", 1)                                                                  \
    X(STREAM_QUERY_SIDE, "cuStreamQuery.side", 1)                                                                      \
    X(EVENT_RECORD_SIDE, "cuEventRecord.side", 1)                                                                      \
    X(EVENT_QUERY_SIDE, "cuEventQuery.side", 1)                                                                        \
    X(EVENT_RECORD_CAPTURING, "cuEventRecord.capturing", 1)                                                            \
    X(EVENT_QUERY_CAPTURING, "cuEventQuery.capturing", 1)                                                              \
    X(STREAM_SYNCHRONIZE_SIDE, "cuStreamSynchronize.side", 1)                                                          \
    X(MEM_POOL_GET_ATTRIBUTE, "cuMemPoolGetAttribute", 1)                                                              \
    X(DEVICE_GET_GRAPH_MEM_ATTRIBUTE, "cuDeviceGetGraphMemAttribute", 1)                                               \
    X(MEM_POOL_TRIM_TO, "cuMemPoolTrimTo", 1)                                                                          \
    X(DEVICE_GRAPH_MEM_TRIM, "cuDeviceGraphMemTrim", 1)                                                                \
    X(STREAM_GET_CAPTURE_INFO, "cuStreamGetCaptureInfo", 0)                                                            \
    X(CTX_PUSH_POP, "cuCtxPushPop", 1)                                                                                 \
    X(MEM_ALLOC_ASYNC_CAPTURING, "cuMemAllocAsync.capturing", 1)                                                       \
    X(MEMCPY_HTOD, "cuMemcpyHtoD", 0)                                                                                  \
    X(POINTER_GET_ATTRIBUTE, "cuPointerGetAttribute", 1)                                                               \
    X(EVENT_SYNCHRONIZE_SIDE, "cuEventSynchronize.side", 1)                                                            \
    X(STREAM_GET_DEVICE_CAPTURING, "cuStreamGetDevice.capturing", 1)                                                   \
    X(STREAM_GET_CTX_CAPTURING, "cuStreamGetCtx.capturing", 1)                                                         \
    X(STREAM_IS_CAPTURING_CAPTURING, "cuStreamIsCapturing.capturing", 1)                                               \
    X(CTX_GET_DEVICE, "cuCtxGetDevice", 1)

#define CAPTURE_OP_ID(id, name, fake) OP_##id,
enum capture_op { CAPTURE_OPS(CAPTURE_OP_ID) N_OPS };
#undef CAPTURE_OP_ID

#endif
