/* Logging: one write(2) per line so that lines of concurrent threads and processes do not interleave. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "log.h"

_Atomic int dl_log_level = DL_LOG_WARN;
void (*dl_log_hook)(int level, const char *line);

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void dl_log(int level, const char *fmt, ...) {
    if (level > dl_log_level) return;
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
