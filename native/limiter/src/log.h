/* log.c: stderr logging with the "dragpu-limiter:" prefix. */
#ifndef DRAGPU_LOG_H
#define DRAGPU_LOG_H

enum { DL_LOG_ERROR = 0, DL_LOG_WARN = 1, DL_LOG_INFO = 2, DL_LOG_DEBUG = 3 };
/* The variable that sets the level; config.c reports a malformed value of it with the other DRAGPU_* ones. */
#define DL_ENV_LOG_LEVEL "DRAGPU_LOG_LEVEL"
/* The level: until something stores one (config.c, tests), the first line logged settles it from DL_ENV_LOG_LEVEL in
 * the environment (warn when absent or malformed), so lines logged before the configuration is read (the driver's
 * load) obey it too. Negative while unsettled. */
extern _Atomic int dl_log_level;
/* "error", "warn", "info" or "debug", any case, into DL_LOG_*; -1 (out untouched) when it is none of them. */
int dl_parse_log_level(const char *s, int *out);
/* The value of DL_ENV_LOG_LEVEL in envp (the last one when it is set more than once); NULL when unset. */
const char *dl_log_level_setting(char *const *envp);
/* Tests capture log lines through this hook; NULL (the default) writes them to stderr. */
extern void (*dl_log_hook)(int level, const char *line);
void dl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define dl_error(...) dl_log(DL_LOG_ERROR, __VA_ARGS__)
#define dl_warn(...) dl_log(DL_LOG_WARN, __VA_ARGS__)
#define dl_info(...) dl_log(DL_LOG_INFO, __VA_ARGS__)
#define dl_debug(...) dl_log(DL_LOG_DEBUG, __VA_ARGS__)

#endif
