/*
 * A fake NVML (libnvidia-ml.so.1) for testing the limiter without a GPU. It describes the same devices
 * as the fake driver (fake_common.h) and keeps NVML's return codes and struct layouts (declared in
 * src/nvml_min.h, cross-checked against nvidia-ml-py). Memory in use is what the fake driver has
 * allocated in this process when it is loaded, else zero.
 *
 * The per-process calls (running compute processes, process utilization) answer for every process of the
 * machine that uses the fake driver, from what each publishes (fake_processes.h), with nvml.h's return
 * codes: a count too small is NVML_ERROR_INSUFFICIENT_SIZE with the count needed; utilization samples are
 * those newer than lastSeenTimeStamp, none is NVML_ERROR_NOT_FOUND. Sample timestamps are microseconds of
 * CLOCK_MONOTONIC (the real driver's are the CPU's wall clock; callers use them only to ask for newer ones).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_common.h"
#include "fake_processes.h"
#include "nvml_min.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x4e564d4cu

struct nvmlDevice_st {
    unsigned magic;
    int index;
};
static struct nvmlDevice_st handles[FAKE_MAX_DEVICES];
static int initialized; /* nvmlInit* calls not yet shut down: NVML counts them */

static nvmlReturn_t device_index(nvmlDevice_t d, int *i) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || d->magic != MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t init(void) {
    for (int i = 0; i < FAKE_MAX_DEVICES; i++) handles[i] = (struct nvmlDevice_st){MAGIC, i};
    initialized++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init();
}
EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
        case NVML_SUCCESS:
            return "Success";
        case NVML_ERROR_UNINITIALIZED:
            return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT:
            return "Invalid Argument";
        case NVML_ERROR_NOT_FOUND:
            return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE:
            return "Insufficient Size";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            return "Argument Version Mismatch";
        default:
            return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)fake_device_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= (unsigned)fake_device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &handles[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fake_device_count(); i++) {
        char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        fake_uuid_string(i, s, sizeof s);
        if (strcmp(s, uuid) == 0) {
            *d = &handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    char s[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    fake_uuid_string(i, s, sizeof s);
    if (len < strlen(s) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!name || len < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, len, "Fake GPU %d", i);
    return NVML_SUCCESS;
}

static uint64_t used_bytes(int i) {
    /* The fake driver's accounting, when it is loaded in this process. */
    uint64_t (*fn)(int) = (uint64_t (*)(int))dlsym(RTLD_DEFAULT, "fakecuda_used_bytes");
    return fn ? fn(i) : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = fake_memory_bytes();
    m->used = used_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    int i;
    nvmlReturn_t r = device_index(d, &i);
    if (r != NVML_SUCCESS) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = fake_memory_bytes();
    m->reserved = 0;
    m->used = used_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    if (!v || len < 8) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(v, len, "580.00");
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = (int)fake_env_u64("FAKE_CUDA_DRIVER_VERSION", 13000);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---------------------------------------------------------------- per-process figures */

/* nvml.h's layouts (not in nvml_min.h: the limiter never asks them). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} fake_nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} fake_nvmlProcessInfo_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} fake_nvmlProcessUtilizationSample_t;

#define MAX_PROCESSES 256
struct seen {
    unsigned pid;
    uint64_t used, busy_ns, at_ns;
};

static int alive(unsigned pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *end = strrchr(buf, ')');
    return end && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
}

/* The live processes of the fake driver holding memory on device i. */
static int processes_on(int i, struct seen *out, int max) {
    const char *dir = getenv("FAKE_CUDA_PROCESS_DIR");
    if (!dir || !*dir) return 0;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    fake_uuid_string(i, uuid, sizeof uuid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char *end;
        unsigned long pid = strtoul(e->d_name, &end, 10);
        if (*end || !pid || !alive((unsigned)pid)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct fake_process p;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = read(fd, &p, sizeof p);
        close(fd);
        if (got != (ssize_t)sizeof p || p.magic != FAKE_PROCESS_MAGIC || p.pid != pid) continue;
        for (unsigned k = 0; k < p.count && k < FAKE_MAX_DEVICES; k++) {
            if (strncmp(p.device[k].uuid, uuid, sizeof p.device[k].uuid) != 0 || !p.device[k].used) continue;
            out[n++] = (struct seen){(unsigned)pid, p.device[k].used, p.device[k].busy_ns, p.device[k].at_ns};
        }
    }
    closedir(d);
    return n;
}

static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, int version) {
    int i;
    nvmlReturn_t r = device_index(device, &i);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    struct seen seen[MAX_PROCESSES];
    int n = processes_on(i, seen, MAX_PROCESSES);
    if (*count < (unsigned)n) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < n; k++) {
        if (version == 1) {
            ((fake_nvmlProcessInfo_v1_t *)infos)[k] = (fake_nvmlProcessInfo_v1_t){seen[k].pid, seen[k].used};
        } else {
            ((fake_nvmlProcessInfo_v2_t *)infos)[k] =
                (fake_nvmlProcessInfo_v2_t){seen[k].pid, seen[k].used, 0xFFFFFFFFu, 0xFFFFFFFFu};
        }
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos) {
    return running(d, count, infos, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, void *infos) {
    return running(d, count, infos, 2);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos) {
    return running(d, count, infos, 3);
}

/* The driver's sample buffer, as this process has seen it: one sample per process and publication. */
#define RING 1024
static fake_nvmlProcessUtilizationSample_t ring[FAKE_MAX_DEVICES][RING];
static unsigned ring_len[FAKE_MAX_DEVICES], ring_pos[FAKE_MAX_DEVICES];
static struct seen last[FAKE_MAX_DEVICES][MAX_PROCESSES];
static int last_n[FAKE_MAX_DEVICES];

static void take_samples(int i) {
    struct seen now[MAX_PROCESSES];
    int n = processes_on(i, now, MAX_PROCESSES);
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < last_n[i]; j++) {
            struct seen *was = &last[i][j];
            if (was->pid != now[k].pid || now[k].at_ns <= was->at_ns) continue;
            uint64_t share = (now[k].busy_ns - was->busy_ns) * 100 / (now[k].at_ns - was->at_ns);
            ring[i][ring_pos[i]] = (fake_nvmlProcessUtilizationSample_t){
                now[k].pid, now[k].at_ns / 1000, share > 100 ? 100 : (unsigned)share, 0, 0, 0};
            ring_pos[i] = (ring_pos[i] + 1) % RING;
            if (ring_len[i] < RING) ring_len[i]++;
        }
    }
    memcpy(last[i], now, sizeof now[0] * (size_t)n);
    last_n[i] = n;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, void *utilization, unsigned int *count,
                                                    unsigned long long lastSeenTimeStamp) {
    int i;
    nvmlReturn_t r = device_index(device, &i);
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!utilization) take_samples(i); /* the sizing call sees what the next call will */
    unsigned n = 0;
    for (unsigned k = 0; k < ring_len[i]; k++)
        if (ring[i][k].timeStamp > lastSeenTimeStamp) n++;
    if (!n) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    fake_nvmlProcessUtilizationSample_t *out = utilization;
    unsigned w = 0;
    for (unsigned k = 0; k < ring_len[i]; k++) {
        unsigned at = (ring_pos[i] + RING - ring_len[i] + k) % RING; /* oldest first */
        if (ring[i][at].timeStamp > lastSeenTimeStamp) out[w++] = ring[i][at];
    }
    *count = w;
    return NVML_SUCCESS;
}
