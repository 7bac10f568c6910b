/* The fake driver's cuGetProcAddress table (generated from src/cuda_min.h by gen_proctable.py). */
#ifndef FAKE_PROCTABLE_H
#define FAKE_PROCTABLE_H

typedef void (*fake_fn)(void);

struct fake_proc_entry {
    const char *base;   /* name cuGetProcAddress is asked for, e.g. "cuMemAlloc" */
    int version;        /* CUDA version that introduced this ABI variant, e.g. 3020 */
    int per_thread;     /* 1 for the _ptsz/_ptds variant */
    const char *symbol; /* exported name of the variant, e.g. "cuMemAlloc_v2" */
    fake_fn fn;         /* the fake's own definition (never looked up through dlsym) */
};

extern const struct fake_proc_entry fake_proc_table[];
extern const unsigned fake_proc_table_len;

#endif
