/*
 * The real CUDA runtime (the toolkit's libcudart) against the fake driver with the limiter preloaded.
 * The runtime loads libcuda.so.1, takes cuGetProcAddress_v2 through dlsym and resolves hundreds of entry
 * points through it (asking for cuGetProcAddress itself too); it stops at cuGetExportTable, which a fake
 * cannot answer. Checks: the runtime went through the limiter's resolver, and every lookup the fake
 * answered with an entry point the limiter wraps was handed our wrapper of that exact symbol.
 *
 * usage: t_cudart <fake lookup log> <limiter log>   (run.sh sets FAKE_CUDA_GETPROC_LOG and redirects stderr)
 */
#include "check.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: t_cudart <fake lookup log> <limiter log>");
    int n = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    CHECK(e != cudaSuccess, "a fake driver cannot satisfy the runtime past cuGetExportTable");

    FILE *f = fopen(argv[1], "r");
    CHECK(f, "no lookup log %s", argv[1]);
    FILE *lim = fopen(argv[2], "r");
    CHECK(lim, "no limiter log %s", argv[2]);
    static char limiter_log[1 << 20];
    size_t len = fread(limiter_log, 1, sizeof limiter_log - 1, lim);
    limiter_log[len] = '\0';
    fclose(lim);

    char name[128], symbol[128];
    int version, lookups = 0, routed = 0, self = 0;
    unsigned long long flags;
    while (fscanf(f, "%127s %d %llu %127s", name, &version, &flags, symbol) == 4) {
        lookups++;
        if (strcmp(name, "cuGetProcAddress") == 0) self++;
        void *ours = strcmp(symbol, "-") ? dlsym(RTLD_DEFAULT, symbol) : NULL;
        if (!ours || strcmp(owner_of(ours, NULL), "limiter") != 0) continue; /* not wrapped */
        char line[512];
        snprintf(line, sizeof line, "cuGetProcAddress(%s, %d, %llu) -> %s\n", name, version, flags, symbol);
        CHECK(strstr(limiter_log, line), "the runtime's lookup %s %d %llu (driver: %s) was not routed to our %s", name,
              version, flags, symbol, symbol);
        routed++;
    }
    fclose(f);
    CHECK(lookups > 100, "the runtime made only %d lookups", lookups);
    CHECK(self >= 2, "the runtime did not look up cuGetProcAddress itself");
    CHECK(routed >= 10, "only %d lookups concerned wrapped entry points", routed);
    printf("t_cudart: ok (%d lookups by the runtime, %d routed to wrappers)\n", lookups, routed);
    return 0;
}
