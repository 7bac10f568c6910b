/* Minimal assertions for the limiter's C tests: a failed check prints where and why, and exits 1. */
#ifndef LIMITER_TEST_CHECK_H
#define LIMITER_TEST_CHECK_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                                             \
    do {                                                                                                               \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);                                 \
        CHECK(a_ == b_, "%s = %llu, expected %s = %llu", #a, a_, #b, b_);                                              \
    } while (0)

#define CHECK_CU(call, expected)                                                                                       \
    do {                                                                                                               \
        int r_ = (int)(call);                                                                                          \
        CHECK(r_ == (int)(expected), "%s returned %d, expected %s (%d)", #call, r_, #expected, (int)(expected));       \
    } while (0)

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

/* Which library a function pointer belongs to ("limiter", "fake", or the file name), and its symbol. */
static inline const char *owner_of(const void *p, const char **symbol) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) {
        if (symbol) *symbol = "?";
        return "?";
    }
    if (symbol) *symbol = info.dli_sname ? info.dli_sname : "?";
    if (strstr(info.dli_fname, "libdragpu-limiter")) return "limiter";
    if (strstr(info.dli_fname, "fake/libcuda") || strstr(info.dli_fname, "fake/libnvidia-ml")) return "fake";
    return info.dli_fname;
}

#define CHECK_OWNER(p, want_owner, want_symbol)                                                                        \
    do {                                                                                                               \
        const char *sym_;                                                                                              \
        const char *own_ = owner_of((const void *)(p), &sym_);                                                         \
        CHECK(strcmp(own_, want_owner) == 0 && strcmp(sym_, want_symbol) == 0,                                         \
              "%s resolves to %s in %s, expected %s in %s", #p, sym_, own_, want_symbol, want_owner);                  \
    } while (0)

/* The mode a test runs in: "limited" (limiter preloaded) or "baseline" (calls go straight to the fake). */
static inline int limited_mode(int argc, char **argv) {
    CHECK(argc >= 2 && (strcmp(argv[1], "limited") == 0 || strcmp(argv[1], "baseline") == 0),
          "usage: %s limited|baseline", argv[0]);
    return strcmp(argv[1], "limited") == 0;
}

#endif
