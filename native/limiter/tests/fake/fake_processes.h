/*
 * What the fake driver knows of each process that uses it, as the real kernel driver knows it and NVML
 * reports it per process: a file per process, $FAKE_CUDA_PROCESS_DIR/<pid>, a shared mapping the fake
 * driver (tests/fake/cuda/publish.c) keeps current and the fake NVML (fake_nvml.c, and tests/fakes/
 * fake_pynvml.py) reads. Unset: no process is published and NVML lists none.
 */
#ifndef FAKE_PROCESSES_H
#define FAKE_PROCESSES_H

#include <stdint.h>

#include "fake_common.h"

#define FAKE_PROCESS_MAGIC 0x31434f5250414446ull /* "FDAPROC1" */
#define FAKE_PROCESS_PERIOD_NS 10000000ull       /* the driver publishes every 10 ms */

struct fake_process_device {
    char uuid[48];    /* as the process's driver names the device (CUDA_VISIBLE_DEVICES) */
    uint64_t used;    /* bytes the process holds on it (contexts included) */
    uint64_t busy_ns; /* kernel time the process has run on it so far */
    uint64_t at_ns;   /* CLOCK_MONOTONIC when these were published */
    uint64_t reserved;
};

struct fake_process {
    uint64_t magic;
    uint32_t pid;
    uint32_t count; /* devices */
    uint64_t seq;   /* odd while the driver writes */
    uint64_t reserved;
    struct fake_process_device device[FAKE_MAX_DEVICES];
};

#endif
