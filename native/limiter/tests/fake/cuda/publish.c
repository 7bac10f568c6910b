/*
 * The fake driver publishes what this process holds and runs on each device (tests/fake/fake_processes.h),
 * every FAKE_PROCESS_PERIOD_NS from a thread of its own, so that the fake NVML can answer the per-process
 * calls for every process on the machine as the real one does. Nothing on the launch or allocation paths.
 * A forked child publishes its own (the parent's figures are the parent's).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_processes.h"

static struct fake_process *page;

static uint64_t busy_so_far(struct device *d, uint64_t now) {
    uint64_t b = d->busy_total;
    if (d->busy_until > now)
        for (int i = 0; i < QUEUE_DEPTH; i++) {
            uint64_t st = d->queue_start[i], en = d->queue_end[i];
            if (en > now) b -= en - (st > now ? st : now);
        }
    return b;
}

static void publish(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    pthread_mutex_lock(&mu);
    __atomic_store_n(&page->seq, page->seq + 1, __ATOMIC_RELEASE);
    for (int i = 0; i < G.count; i++) {
        page->device[i].used = devices[i].used;
        page->device[i].busy_ns = busy_so_far(&devices[i], now);
        page->device[i].at_ns = now;
    }
    __atomic_store_n(&page->seq, page->seq + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&mu);
}

static void *publisher(void *arg) {
    (void)arg;
    struct timespec period = {0, (long)FAKE_PROCESS_PERIOD_NS};
    for (;;) {
        publish();
        nanosleep(&period, NULL);
    }
    return NULL;
}

static void start(void) {
    const char *dir = getenv("FAKE_CUDA_PROCESS_DIR");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    void *p = MAP_FAILED;
    if (ftruncate(fd, sizeof *page) == 0) p = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    page = p;
    page->pid = (uint32_t)getpid();
    page->count = (uint32_t)G.count;
    for (int i = 0; i < G.count; i++) fake_uuid_string(i, page->device[i].uuid, sizeof page->device[i].uuid);
    __atomic_store_n(&page->magic, FAKE_PROCESS_MAGIC, __ATOMIC_RELEASE);
    pthread_t t;
    if (pthread_create(&t, NULL, publisher, NULL) == 0) pthread_detach(t);
}

static void in_child(void) {
    page = NULL; /* the parent's mapping, which the child must not write */
    start();
}

void fake_publish_start(void) {
    pthread_atfork(NULL, NULL, in_child);
    start();
}
