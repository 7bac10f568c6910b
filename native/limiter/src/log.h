/* log.c: stderr logging with the "dragpu-limiter:" prefix. */
#ifndef DRAGPU_LOG_H
#define DRAGPU_LOG_H

enum { DL_LOG_ERROR = 0, DL_LOG_WARN = 1, DL_LOG_INFO = 2, DL_LOG_DEBUG = 3 };
extern _Atomic int dl_log_level;
/* Tests capture log lines through this hook; NULL (the default) writes them to stderr. */
extern void (*dl_log_hook)(int level, const char *line);
void dl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define dl_error(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)
#define dl_warn(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define dl_info(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define dl_debug(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)

#endif
