/*
 * Several processes of one claim share one region (the environment - LD_PRELOAD, the limit and the state
 * directory - is inherited from tests/run.sh). Each process is a limiter-probe, as in a container:
 *
 *   1. a holder keeps 768 MiB of the 1 GiB limit; another process then gets only the remaining 256 MiB,
 *      and `limiter-probe info` reports total 1 GiB, free 256 MiB;
 *   2. the holder is killed with SIGKILL; its memory comes back (a new process gets the full 1 GiB);
 *   3. four processes allocating concurrently get exactly 1 GiB between them;
 *   4. holders in two separate PID namespaces (both are PID 1 there) are told apart and both counted,
 *      and once killed, their memory stays charged as seen from another PID namespace, where their death
 *      cannot be proven - until the node agent, which sees every process, marks the slot gone (done here
 *      as src/dra_gpu/limiter_abi/region.py does it): then it comes back, and only the dead holder's
 *      (skipped where user namespaces are unavailable).
 *
 * With `contexts <cap MiB>` (run under that cap, the fake's contexts of their real size) it checks what the
 * driver takes for each process's context is charged (tests/real-gpu/h100-driver-facts.txt: 549 MB on an
 * H100), so that the claim's account matches what nvidia-smi shows:
 *
 *   5. one process alone can allocate the cap less one context, short of it by at most one chunk;
 *   6. two processes together the cap less two contexts; when one is killed, its context comes back.
 *
 * usage: t_multiproc <build dir> [contexts <cap MiB>]
 */
#include "check.h"
#include "fake_common.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char probe[4096];

struct proc {
    pid_t pid;
    int out;
    char buf[65536]; /* a probe prints a line per allocation */
    size_t len;
};

static void start(struct proc *p, char *const argv[]) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe: %s", strerror(errno));
    p->pid = fork();
    CHECK(p->pid >= 0, "fork: %s", strerror(errno));
    if (p->pid == 0) {
        /* Dies with this test, whatever check fails: a holder left behind keeps the suite's pipe open. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    p->out = fds[0];
    p->len = 0;
    p->buf[0] = '\0';
}

/* Reads the process's output until it contains `needle` (or the process closes it); 20 s at most. */
static int read_until(struct proc *p, const char *needle) {
    for (int waited = 0; !strstr(p->buf, needle) && waited < 20000;) {
        struct pollfd pfd = {.fd = p->out, .events = POLLIN};
        int r = poll(&pfd, 1, 100);
        waited += 100;
        if (r <= 0) continue;
        ssize_t n = read(p->out, p->buf + p->len, sizeof p->buf - 1 - p->len);
        if (n <= 0) break;
        p->len += (size_t)n;
        p->buf[p->len] = '\0';
    }
    return strstr(p->buf, needle) != NULL;
}

static void finish(struct proc *p, int kill_it) {
    if (kill_it) kill(p->pid, SIGKILL);
    int status;
    waitpid(p->pid, &status, 0);
    close(p->out);
    if (!kill_it)
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe exited with status %d:\n%s", status, p->buf);
}

static unsigned long long field(const char *text, const char *name) {
    const char *s = strstr(text, name);
    CHECK(s, "no %s in:\n%s", name, text);
    return strtoull(s + strlen(name), NULL, 10);
}

static void run_probe(struct proc *p, char *const argv[]) {
    start(p, argv);
    read_until(p, "\x01"); /* until EOF */
    finish(p, 0);
}

static unsigned long long free_now(void) {
    struct proc p;
    char *argv[] = {probe, "info", NULL};
    run_probe(&p, argv);
    CHECK_EQ_U64(field(p.buf, "total="), 1 * GiB);
    return field(p.buf, "free=");
}

/* Offsets in the region file (src/region.c, mirrored by src/dra_gpu/limiter_abi/region.py). */
#define SLOTS_AT (4096 + 128 * 256)
#define SLOT_BYTES 192
#define SLOT_GONE 2u

static int slot_lock(int fd, int slot, short type, int cmd) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 1 + slot, .l_len = 1};
    if (fcntl(fd, cmd, &fl) != 0) return -1;
    return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

/* What the node agent does for a process it found gone from the node: every slot in use whose lock no
 * process holds is taken (without waiting), marked SLOT_GONE and let go. Only the dead holder's qualifies
 * here: the live one holds its lock. Returns how many were marked. */
static int mark_unlocked_slots_gone(void) {
    char path[4200];
    snprintf(path, sizeof path, "%s/dragpu-limiter.region", getenv("DRAGPU_LIMITER_STATE_DIR"));
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0, "%s: %s", path, strerror(errno));
    int marked = 0;
    for (int i = 0; i < 1024; i++) {
        uint32_t in_use = 0;
        off_t at = SLOTS_AT + (off_t)i * SLOT_BYTES;
        CHECK(pread(fd, &in_use, sizeof in_use, at) == (ssize_t)sizeof in_use, "pread");
        if (in_use != 1 || slot_lock(fd, i, F_WRLCK, F_OFD_GETLK) != F_UNLCK) continue;
        if (slot_lock(fd, i, F_WRLCK, F_OFD_SETLK) != 0) continue;
        in_use = SLOT_GONE;
        CHECK(pwrite(fd, &in_use, sizeof in_use, at) == (ssize_t)sizeof in_use, "pwrite");
        slot_lock(fd, i, F_UNLCK, F_OFD_SETLK);
        marked++;
    }
    close(fd);
    return marked;
}

static int have_user_pid_namespaces(void) {
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", 1);
        dup2(null, 2);
        execlp("unshare", "unshare", "--user", "--map-root-user", "--pid", "--fork", "true", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* 5 and 6: every process's context is charged what the driver took for it. */
static int contexts(unsigned long long cap) {
    const unsigned long long ctx = fake_context_bytes(), chunk = 2 * MiB;
    CHECK(ctx > chunk && cap > 2 * ctx + GiB, "a context of %llu bytes under a cap of %llu", ctx, cap);
    struct proc one, holder, other;
    char *fill_argv[] = {probe, "alloc", "2097152", NULL};
    run_probe(&one, fill_argv);
    unsigned long long alone = field(one.buf, "allocated=");
    CHECK(alone <= cap - ctx, "one process allocated %llu MiB of %llu: more than the cap less its context (%llu bytes)",
          alone / MiB, cap / MiB, ctx);
    CHECK(alone + chunk >= cap - ctx, "one process allocated only %llu MiB of %llu", alone / MiB, cap / MiB);

    char *hold_argv[] = {probe, "alloc", "67108864", "16", "--hold", NULL};
    start(&holder, hold_argv);
    CHECK(read_until(&holder, "holding"), "holder did not get to hold:\n%s", holder.buf);
    CHECK_EQ_U64(field(holder.buf, "allocated="), GiB);
    run_probe(&other, fill_argv);
    unsigned long long together = GiB + field(other.buf, "allocated=");
    CHECK(together <= cap - 2 * ctx,
          "two processes allocated %llu MiB of %llu: more than the cap less their two contexts (%llu bytes each)",
          together / MiB, cap / MiB, ctx);
    CHECK(together + 2 * chunk >= cap - 2 * ctx, "two processes allocated only %llu MiB of %llu", together / MiB,
          cap / MiB);
    finish(&holder, 1);
    run_probe(&one, fill_argv);
    CHECK_EQ_U64(field(one.buf, "allocated="), alone);
    printf("t_multiproc contexts: %llu MiB alone, %llu MiB for two processes under %llu MiB (context %llu bytes)\n",
           alone / MiB, together / MiB, cap / MiB, ctx);
    return 0;
}

int main(int argc, char **argv) {
    CHECK(argc == 2 || (argc == 4 && strcmp(argv[2], "contexts") == 0),
          "usage: t_multiproc <build dir> [contexts <cap MiB>]");
    snprintf(probe, sizeof probe, "%s/limiter-probe", argv[1]);
    if (argc == 4) return contexts(strtoull(argv[3], NULL, 10) * MiB);

    /* 1. holder + second process */
    struct proc holder, other;
    char *hold_argv[] = {probe, "alloc", "268435456", "3", "--hold", NULL};
    start(&holder, hold_argv);
    CHECK(read_until(&holder, "holding"), "holder did not get to hold:\n%s", holder.buf);
    CHECK_EQ_U64(field(holder.buf, "allocated="), 768 * MiB);
    CHECK_EQ_U64(free_now(), 256 * MiB);
    char *fill_argv[] = {probe, "alloc", "134217728", NULL};
    run_probe(&other, fill_argv);
    CHECK_EQ_U64(field(other.buf, "allocated="), 256 * MiB);
    CHECK(strstr(other.buf, "last=CUDA_ERROR_OUT_OF_MEMORY"), "expected a refusal:\n%s", other.buf);

    /* 2. SIGKILL gives the memory back */
    finish(&holder, 1);
    CHECK_EQ_U64(free_now(), 1 * GiB);
    run_probe(&other, fill_argv);
    CHECK_EQ_U64(field(other.buf, "allocated="), 1 * GiB);

    /* 3. concurrent admission never overshoots */
    struct proc racers[4];
    char *race_argv[] = {probe, "alloc", "33554432", "--hold", NULL};
    for (int i = 0; i < 4; i++) start(&racers[i], race_argv);
    unsigned long long sum = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(read_until(&racers[i], "holding"), "racer %d:\n%s", i, racers[i].buf);
        sum += field(racers[i].buf, "allocated=");
    }
    CHECK_EQ_U64(sum, 1 * GiB);
    for (int i = 0; i < 4; i++) finish(&racers[i], 1);
    CHECK_EQ_U64(free_now(), 1 * GiB);

    /* 4. separate PID namespaces */
    if (!have_user_pid_namespaces()) {
        printf("t_multiproc: ok (PID namespace case skipped: unshare --user --pid is not permitted here)\n");
        return 0;
    }
    struct proc ns[2];
    char *ns_argv[] = {"unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
                       probe,     "alloc",  "268435456",       "1",     "--hold", NULL};
    for (int i = 0; i < 2; i++) {
        start(&ns[i], ns_argv);
        CHECK(read_until(&ns[i], "holding"), "namespaced holder %d:\n%s", i, ns[i].buf);
    }
    CHECK_EQ_U64(free_now(), 512 * MiB);
    /* Their PIDs cannot be checked from this namespace, so an unlocked slot is no proof of death: what a
     * killed holder held stays charged here (the claim gets less than its limit, never more). */
    finish(&ns[0], 1);
    CHECK_EQ_U64(free_now(), 512 * MiB);
    /* The agent finds it gone: the next sweep gives its memory back; the live holder's stays charged. The
     * holder dies when its unshare does (--kill-child), a moment later: until then its slot is still locked,
     * and what is marked meanwhile are slots of probes that exited, holding nothing. */
    unsigned long long now_free = 0;
    for (time_t deadline = time(NULL) + 10; now_free != 768 * MiB && time(NULL) < deadline;) {
        mark_unlocked_slots_gone();
        now_free = free_now();
    }
    CHECK_EQ_U64(now_free, 768 * MiB);
    finish(&ns[1], 1);
    printf("t_multiproc: ok\n");
    return 0;
}
