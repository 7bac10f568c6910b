/*
 * Stream capture survives the limiter. What PyTorch does with backend:cudaMallocAsync and torch.cuda.graph:
 * the default pool is in use (it keeps what was freed), then a capture allocates from it, launches, and
 * ends; the graph is instantiated and launched. The capture must end as it does without the limiter, and
 * the graph's memory must be charged once it runs. Once per capture mode, and once with a global-mode
 * capture open in another thread while this thread allocates from the pool and synchronises (the
 * library's own pool reads must not invalidate that capture).
 *
 * usage: t_capture global|thread-local|relaxed|other-thread  (run with DRAGPU_MEMORY_LIMIT=1Gi and, to
 * throttle the captured launch too, DRAGPU_CORES_LIMIT)
 *        t_capture record FILE  the real driver's record (tests/real-gpu/h100-driver-facts.txt): each
 *        `capture.*` line of a call the fake implements is repeated as driver-facts.cu made it, in the same
 *        order, and must give the same two results (the call's, then cuStreamEndCapture's); and what the
 *        driver's own error log showed of cuStreamGetDevice on a capturing stream (logged_rules)
 */
#include "capture_ops.h"
#include "device.h"
#include <pthread.h>

#define MiB (1024ull * 1024ull)
#define LIMIT (1024 * MiB)

uint64_t fakecuda_used_bytes(int device);

static uint64_t accounted(void) {
    size_t free_b, total;
    CHECK_CU(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    return total == LIMIT ? total - free_b : fakecuda_used_bytes(0); /* baseline: no limiter */
}

static CUfunction fn;

/* The pool in use: memory allocated and freed, kept by the pool (threshold: keep everything). */
static void use_pool(CUstream s) {
    CUmemoryPool pool;
    CHECK_CU(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    cuuint64_t keep = ~0ull;
    CHECK_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), CUDA_SUCCESS);
    CUdeviceptr p;
    CHECK_CU(cuMemAllocAsync(&p, 64 * MiB, s), CUDA_SUCCESS);
    CHECK_CU(cuMemFreeAsync(p, s), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
}

static void capture_alloc(CUstream s, CUstreamCaptureMode mode) {
    uint64_t before = fakecuda_used_bytes(0);
    CUgraph g;
    CUgraphExec e;
    CUdeviceptr v;
    CHECK_CU(cuStreamBeginCapture_v2(s, mode), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&v, 256 * MiB, s), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    CHECK_CU(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(g != NULL, "the capture produced no graph");
    CHECK_CU(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    CHECK_CU(cuGraphLaunch(e, s), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK(fakecuda_used_bytes(0) >= before + 256 * MiB, "the graph's allocation was not made");
    CHECK_EQ_U64(accounted(), fakecuda_used_bytes(0)); /* the graph's memory is charged */
    CHECK_CU(cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
}

static CUcontext ctx;
static CUstream other;
static pthread_barrier_t began, done;

/* Another thread's global-mode capture, open while the main thread works. */
static void *capturer(void *arg) {
    (void)arg;
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_CU(cuStreamBeginCapture_v2(other, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, other, NULL, NULL), CUDA_SUCCESS);
    pthread_barrier_wait(&began);
    pthread_barrier_wait(&done);
    CUgraph g;
    CHECK_CU(cuStreamEndCapture(other, &g), CUDA_SUCCESS);
    CHECK_CU(cuGraphDestroy(g), CUDA_SUCCESS);
    return NULL;
}

/* ---- the real driver's record, repeated (driver-facts.cu's capture_rules: the operations of capture_ops.h) ---- */
CUresult CUDAAPI cuStreamQuery(CUstream s);                  /* not in cuda_min.h: the library never calls it */
CUresult CUDAAPI cuStreamGetDevice(CUstream s, CUdevice *d); /* not declared in cuda_min.h (its type is) */

static CUstream side;    /* a stream that is never captured */
static CUdeviceptr held; /* an allocation made before capture */
static CUevent ev_side, ev_cap;

/* The record's operations (capture_ops.h); NULL: one the fake does not implement. */
#define OP_NAME(id, name, fake) (fake) ? name : NULL,
static const char *op_names[N_OPS] = {CAPTURE_OPS(OP_NAME)};
#undef OP_NAME

static CUresult run_op(int op, CUstream cap) {
    size_t f, t;
    CUdeviceptr p;
    CUmemoryPool pool;
    cuuint64_t v;
    CUcontext c;
    switch (op) {
        case OP_MEM_GET_INFO:
            return cuMemGetInfo_v2(&f, &t);
        case OP_MEM_ALLOC: {
            CUresult r = cuMemAlloc_v2(&p, 1 << 20);
            if (r == CUDA_SUCCESS) cuMemFree_v2(p);
            return r;
        }
        case OP_MEM_FREE: {
            CUdeviceptr q;
            if (cuMemAlloc_v2(&q, 1 << 20) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
            return cuMemFree_v2(q);
        }
        case OP_CTX_SYNCHRONIZE:
            return cuCtxSynchronize();
        case OP_STREAM_QUERY_CAPTURING:
            return cuStreamQuery(cap);
        case OP_STREAM_QUERY_LEGACY:
            return cuStreamQuery((CUstream)0);
        case OP_STREAM_QUERY_SIDE:
            return cuStreamQuery(side);
        case OP_EVENT_RECORD_SIDE:
            return cuEventRecord(ev_side, side);
        case OP_EVENT_QUERY_SIDE:
            return cuEventQuery(ev_side);
        case OP_EVENT_RECORD_CAPTURING:
            return cuEventRecord(ev_cap, cap);
        case OP_EVENT_QUERY_CAPTURING:
            return cuEventQuery(ev_cap);
        case OP_STREAM_SYNCHRONIZE_SIDE:
            return cuStreamSynchronize(side);
        case OP_MEM_POOL_GET_ATTRIBUTE:
            if (cuDeviceGetDefaultMemPool(&pool, 0) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
            return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
        case OP_DEVICE_GET_GRAPH_MEM_ATTRIBUTE:
            return cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v);
        case OP_MEM_POOL_TRIM_TO:
            if (cuDeviceGetDefaultMemPool(&pool, 0) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
            return cuMemPoolTrimTo(pool, 0);
        case OP_DEVICE_GRAPH_MEM_TRIM:
            return cuDeviceGraphMemTrim(0);
        case OP_CTX_PUSH_POP: {
            CUresult r = cuCtxPushCurrent_v2(ctx);
            if (r == CUDA_SUCCESS) r = cuCtxPopCurrent_v2(&c);
            return r;
        }
        case OP_MEM_ALLOC_ASYNC_CAPTURING: {
            CUresult r = cuMemAllocAsync(&p, 1 << 20, cap);
            if (r == CUDA_SUCCESS) r = cuMemFreeAsync(p, cap);
            return r;
        }
        case OP_POINTER_GET_ATTRIBUTE: { /* the record asked for the memory type; the fake answers the device ordinal */
            int o;
            return cuPointerGetAttribute(&o, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, held);
        }
        case OP_EVENT_SYNCHRONIZE_SIDE:
            return cuEventSynchronize(ev_side);
        case OP_STREAM_GET_DEVICE_CAPTURING: {
            CUdevice d;
            return cuStreamGetDevice(cap, &d);
        }
        case OP_STREAM_GET_CTX_CAPTURING:
            return cuStreamGetCtx(cap, &c);
        case OP_STREAM_IS_CAPTURING_CAPTURING: {
            CUstreamCaptureStatus st;
            return cuStreamIsCapturing(cap, &st);
        }
        case OP_CTX_GET_DEVICE: {
            CUdevice d;
            return cuCtxGetDevice(&d);
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

struct other_args {
    int op;
    CUstream cap;
    CUresult result;
};

static void *other_thread(void *p) {
    struct other_args *a = (struct other_args *)p;
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    a->result = run_op(a->op, a->cap);
    return NULL;
}

static const char *err(CUresult r) {
    const char *s = NULL;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "?";
}

/* What the fake gives for `capture.[other_thread.]MODE.OP`, as "call/end", in buf. */
static void measure(int other, int m, int op, char *buf, size_t n) {
    const CUstreamCaptureMode modes[3] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                          CU_STREAM_CAPTURE_MODE_RELAXED};
    CUstream cap;
    CHECK_CU(cuStreamCreate(&cap, 0), CUDA_SUCCESS);
    CHECK_CU(cuEventRecord(ev_side, side), CUDA_SUCCESS);
    CHECK_CU(cuStreamSynchronize(side), CUDA_SUCCESS);
    CHECK_CU(cuStreamBeginCapture_v2(cap, modes[m]), CUDA_SUCCESS);
    CUresult r;
    if (other) {
        struct other_args a = {op, cap, CUDA_ERROR_UNKNOWN};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, other_thread, &a) == 0, "pthread_create");
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        r = a.result;
    } else {
        r = run_op(op, cap);
    }
    CUgraph g = NULL;
    CUresult end = cuStreamEndCapture(cap, &g);
    if (g) cuGraphDestroy(g);
    snprintf(buf, n, "%s/%s", err(r), err(end));
    cuStreamDestroy_v2(cap);
    cuCtxSynchronize();
}

/* What the real driver's own error log (CUDA_LOG_FILE=stdout, same kind of node) showed, not in the record: a
 * captured cuMemAllocAsync under a limiter that asked the capturing stream for its device, in global and
 * thread-local mode, from the capturing thread: cuStreamGetDevice 900 (the capture invalidated), then
 * cuStreamGetCtx and cuMemAllocAsync on that stream 901. How many differ. */
static int logged_rules(void) {
    const CUstreamCaptureMode modes[2] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL};
    int wrong = 0;
    for (int m = 0; m < 2; m++) {
        CUstream cap;
        CHECK_CU(cuStreamCreate(&cap, 0), CUDA_SUCCESS);
        CHECK_CU(cuStreamBeginCapture_v2(cap, modes[m]), CUDA_SUCCESS);
        CUdevice d;
        CUcontext c;
        CUdeviceptr p;
        CUresult got[3] = {cuStreamGetDevice(cap, &d), cuStreamGetCtx(cap, &c), cuMemAllocAsync(&p, 1 << 20, cap)};
        CUgraph g = NULL;
        CUresult end = cuStreamEndCapture(cap, &g);
        if (g) cuGraphDestroy(g);
        const CUresult want[4] = {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                                  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED};
        if (got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || end != want[3]) {
            fprintf(stderr,
                    "capture.%s: cuStreamGetDevice, cuStreamGetCtx, cuMemAllocAsync/end: the fake gives "
                    "%s, %s, %s/%s; the real driver's log %s, %s, %s/%s\n",
                    m ? "thread_local" : "global", err(got[0]), err(got[1]), err(got[2]), err(end), err(want[0]),
                    err(want[1]), err(want[2]), err(want[3]));
            wrong++;
        }
        cuStreamDestroy_v2(cap);
    }
    return wrong;
}

static void record(const char *path) {
    const char *mode_names[3] = {"global", "thread_local", "relaxed"};
    CHECK_CU(cuStreamCreate(&side, 0), CUDA_SUCCESS);
    CHECK_CU(cuEventCreate(&ev_side, 0), CUDA_SUCCESS);
    CHECK_CU(cuEventCreate(&ev_cap, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemAlloc_v2(&held, 1 << 20), CUDA_SUCCESS);
    /* The record's lines by key. */
    static char keys[256][96], want[256][128];
    int nlines = 0;
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    char line[512];
    while (fgets(line, sizeof line, f) && nlines < 256) {
        char *eq = strchr(line, '=');
        if (strncmp(line, "capture.", 8) || !eq) continue;
        *eq = 0;
        eq[strcspn(eq + 1, "\n") + 1] = 0;
        CHECK(strlen(line + 8) < sizeof keys[0] && strlen(eq + 1) < sizeof want[0], "a long line: %s", line);
        memcpy(keys[nlines], line + 8, strlen(line + 8) + 1);
        memcpy(want[nlines], eq + 1, strlen(eq + 1) + 1);
        nlines++;
    }
    fclose(f);
    int checked = 0, wrong = 0;
    for (int other = 0; other < 2; other++)
        for (int m = 0; m < 3; m++)
            for (int op = 0; op < N_OPS; op++) {
                if (!op_names[op]) continue;
                char key[96], got[128];
                snprintf(key, sizeof key, "%s%s.%s", other ? "other_thread." : "", mode_names[m], op_names[op]);
                int i = 0;
                while (i < nlines && strcmp(keys[i], key)) i++;
                CHECK(i < nlines, "the record has no line capture.%s", key);
                measure(other, m, op, got, sizeof got);
                checked++;
                if (strcmp(got, want[i])) {
                    fprintf(stderr, "capture.%s: the fake gives %s, the real driver %s\n", key, got, want[i]);
                    wrong++;
                }
            }
    /* The library's way out: relaxed around a forbidden call in a global-mode capture. */
    CUstream cap;
    CHECK_CU(cuStreamCreate(&cap, 0), CUDA_SUCCESS);
    CHECK_CU(cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    size_t fr, tot;
    CUresult r = cuMemGetInfo_v2(&fr, &tot);
    CUresult q = cuEventQuery(ev_side);
    CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CUgraph g = NULL;
    CUresult end = cuStreamEndCapture(cap, &g);
    if (g) cuGraphDestroy(g);
    char got[128];
    snprintf(got, sizeof got, "%s,%s/%s", err(r), err(q), err(end));
    for (int i = 0; i < nlines; i++)
        if (!strcmp(keys[i], "global.relaxed_around.cuMemGetInfo+cuEventQuery.side")) {
            checked++;
            if (strcmp(got, want[i])) {
                fprintf(stderr, "capture.%s: the fake gives %s, the real driver %s\n", keys[i], got, want[i]);
                wrong++;
            }
        }
    wrong += logged_rules();
    checked += 2;
    CHECK(wrong == 0, "%d of %d capture rules differ from the real driver's record", wrong, checked);
    CHECK(checked >= 6 * 19 + 1, "only %d of the record's capture lines were checked", checked);
    printf("t_capture record: %d capture rules as the real driver's\n", checked);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2, "usage: t_capture global|thread-local|relaxed|other-thread|record FILE");
    ctx = use_device0();
    if (!strcmp(argv[1], "record")) {
        CHECK(argc == 3, "usage: t_capture record FILE");
        record(argv[2]);
        return 0;
    }
    CUmodule mod;
    CHECK_CU(cuModuleLoadData(&mod, "image"), CUDA_SUCCESS);
    CHECK_CU(cuModuleGetFunction(&fn, mod, "k"), CUDA_SUCCESS);
    CUstream s;
    CHECK_CU(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    use_pool(s);
    if (!strcmp(argv[1], "global")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    else if (!strcmp(argv[1], "thread-local")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    else if (!strcmp(argv[1], "relaxed")) capture_alloc(s, CU_STREAM_CAPTURE_MODE_RELAXED);
    else if (!strcmp(argv[1], "other-thread")) {
        /* This thread uses the pool while another captures in global mode: its own calls are the
         * application's business (a stream-ordered allocation and a stream's synchronisation are allowed
         * from a thread in thread-local mode); the library's reads of the pool must not break the capture. */
        CHECK_CU(cuStreamCreate(&other, 0), CUDA_SUCCESS);
        pthread_barrier_init(&began, NULL, 2);
        pthread_barrier_init(&done, NULL, 2);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, capturer, NULL) == 0, "pthread_create");
        pthread_barrier_wait(&began);
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
        for (int i = 0; i < 8; i++) {
            CUdeviceptr p;
            CHECK_CU(cuMemAllocAsync(&p, 96 * MiB, s), CUDA_SUCCESS);
            CHECK_CU(cuLaunchKernel(fn, 132, 1, 1, 128, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
            CHECK_CU(cuMemFreeAsync(p, s), CUDA_SUCCESS);
            CHECK_CU(cuStreamSynchronize(s), CUDA_SUCCESS);
        }
        CHECK_CU(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
        pthread_barrier_wait(&done);
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        CHECK_EQ_U64(accounted(), fakecuda_used_bytes(0));
    } else {
        CHECK(0, "unknown scenario %s", argv[1]);
    }
    printf("t_capture %s: ok\n", argv[1]);
    return 0;
}
