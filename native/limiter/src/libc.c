/*
 * The C library's own dlsym and dlvsym. The limiter exports both (dlsym.c), and a reference from inside the
 * library - even a versioned one, dlvsym@GLIBC_2.34 - binds to its own definitions (an unversioned definition
 * satisfies any version), so they are found the way the dynamic loader would: in the C library's symbol table
 * (its GNU hash table), through the loader's list of loaded objects (_r_debug). No call that a sanitizer
 * intercepts: this runs while their runtimes start up and resolve their interceptors through our dlsym.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <string.h>

#include "libc.h"
#include "common.h"

extern struct r_debug _r_debug;

DL_NO_SANITIZE static int is_libc(const char *path) {
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/') base = p + 1;
    const char *want = "libc.so.";
    for (int i = 0; want[i]; i++)
        if (base[i] != want[i]) return 0;
    return 1;
}

DL_NO_SANITIZE static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

/* A pointer of the dynamic section: relocated in place on most architectures, an offset on others. */
DL_NO_SANITIZE static const void *at(const struct link_map *m, ElfW(Addr) v) {
    return (const void *)(v < m->l_addr ? m->l_addr + v : v);
}

DL_NO_SANITIZE static void *lookup(const struct link_map *m, const char *name) {
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL;
    for (const ElfW(Dyn) *d = m->l_ld; d && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symtab = at(m, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB) strtab = at(m, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH) gnu = at(m, d->d_un.d_ptr);
    }
    if (!symtab || !strtab || !gnu) return NULL;
    uint32_t h = 5381;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = h * 33 + *p;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_words = gnu[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gnu + 4) + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t i = nbuckets ? buckets[h % nbuckets] : 0;
    if (i < symoffset) return NULL;
    for (;; i++) {
        uint32_t c = chain[i - symoffset];
        const ElfW(Sym) *s = &symtab[i];
        if ((c | 1) == (h | 1) && s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            same(strtab + s->st_name, name))
            return (void *)(m->l_addr + s->st_value);
        if (c & 1) return NULL;
    }
}

DL_NO_SANITIZE void *dl_libc_function(const char *name) {
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next) {
        if (!m->l_name || !is_libc(m->l_name)) continue;
        void *f = lookup(m, name);
        if (f) return f;
    }
    return NULL;
}
