/* Logging: one write(2) per line so that lines of concurrent threads and processes do not interleave. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

extern char **environ;

_Atomic int dl_log_level = -1;
void (*dl_log_hook)(int level, const char *line);

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int dl_parse_log_level(const char *s, int *out) {
    if (!s) return -1;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

const char *dl_log_level_setting(char *const *envp) {
    const char *v = NULL;
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, DL_ENV_LOG_LEVEL "=", sizeof DL_ENV_LOG_LEVEL) == 0) v = *e + sizeof DL_ENV_LOG_LEVEL;
    return v;
}

/* The first line logged before anything stored a level: the environment's, unless a store came first. */
static int settle_level(void) {
    int level = DL_LOG_WARN;
    if (dl_parse_log_level(dl_log_level_setting(environ), &level) != 0) level = DL_LOG_WARN;
    int unsettled = -1;
    if (!atomic_compare_exchange_strong(&dl_log_level, &unsettled, level)) level = unsettled;
    return level;
}

void dl_log(int level, const char *fmt, ...) {
    int current = atomic_load_explicit(&dl_log_level, memory_order_relaxed);
    if (current < 0) current = settle_level();
    if (level > current) return;
    int saved_errno = errno;
    char line[1024];
    int n = snprintf(line, sizeof line, "dragpu-limiter: %s: ", level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    line[len] = '\0';
    if (dl_log_hook) {
        dl_log_hook(level, line);
    } else {
        ssize_t w = write(STDERR_FILENO, line, len);
        (void)w;
    }
    errno = saved_errno;
}
