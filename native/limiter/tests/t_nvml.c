/*
 * The capped view is the same through NVML and through CUDA: after allocating through the driver,
 * nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2 and cuMemGetInfo_v2 report the same total and free,
 * and the total is the limit the environment gives for that GPU (global, by ordinal, or by UUID).
 * An NVML query never initialises CUDA (a process that forks CUDA workers after asking NVML would break
 * them): before the program initialises CUDA, a limit by ordinal cannot be told and the next one applies.
 *
 * usage: t_nvml limited <expected limit in bytes> [<expected limit before cuInit>] | t_nvml baseline
 */
#include "device.h"

#include "nvml_min.h"

unsigned long fakecuda_calls(const char *name);

int main(int argc, char **argv) {
    int limited = limited_mode(argc, argv);
    unsigned long long limit = limited && argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    unsigned long long early_limit = limited && argc > 3 ? strtoull(argv[3], NULL, 10) : limit;
    CHECK(!limited || (limit > 0 && early_limit > 0), "limited mode needs the expected limit");

    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(h, "dlopen(libnvidia-ml.so.1): %s", dlerror());
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    dl_pfn_nvmlDeviceGetMemoryInfo info = (dl_pfn_nvmlDeviceGetMemoryInfo)dlsym(h, "nvmlDeviceGetMemoryInfo");
    dl_pfn_nvmlDeviceGetMemoryInfo_v2 info2 = (dl_pfn_nvmlDeviceGetMemoryInfo_v2)dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(init && by_index && info && info2, "missing NVML entry points");
    CHECK_OWNER(info, limited ? "limiter" : "fake", "nvmlDeviceGetMemoryInfo");
    CHECK_OWNER(info2, limited ? "limiter" : "fake", "nvmlDeviceGetMemoryInfo_v2");

    /* NVML answers before any CUDA call (a monitoring tool uses NVML only). */
    nvmlDevice_t nd;
    CHECK_CU(init(), NVML_SUCCESS);
    CHECK_CU(by_index(0, &nd), NVML_SUCCESS);
    nvmlMemory_t m;
    CHECK_CU(info(nd, &m), NVML_SUCCESS);
    if (limited) {
        CHECK_EQ_U64(m.total, early_limit);
        CHECK_EQ_U64(m.free, early_limit);
    }
    CHECK_CU(info(nd, NULL), NVML_ERROR_INVALID_ARGUMENT); /* NULL goes to NVML */
    CHECK(fakecuda_calls("cuInit") == 0, "an NVML query initialised CUDA");

    /* A driver call that names a device before cuInit fails; the limiter must not remember that device
     * under some other key than its UUID (its charges would then be apart from the claim's). */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle handle;
    CHECK_CU(cuMemCreate(&handle, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_INITIALIZED);

    use_device0();
    CUdeviceptr p;
    CHECK_CU(cuMemAlloc_v2(&p, 300 * MiB), CUDA_SUCCESS);

    size_t cfree, ctotal;
    CHECK_CU(cuMemGetInfo_v2(&cfree, &ctotal), CUDA_SUCCESS);
    CHECK_CU(info(nd, &m), NVML_SUCCESS);
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    CHECK_CU(info2(nd, &m2), NVML_SUCCESS);
    CHECK_EQ_U64(m.total, ctotal);
    CHECK_EQ_U64(m.free, cfree);
    CHECK_EQ_U64(m.used, ctotal - cfree);
    CHECK_EQ_U64(m2.total, ctotal);
    CHECK_EQ_U64(m2.free, cfree);
    CHECK_EQ_U64(m2.used + m2.reserved, ctotal - cfree);
    if (limited) {
        CHECK_EQ_U64(ctotal, limit);
        CHECK_EQ_U64(cfree, limit - 300 * MiB);
    }
    m2.version = 1; /* wrong struct version: NVML's error, unchanged */
    CHECK_CU(info2(nd, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    printf("t_nvml %s: ok\n", limited ? "limited" : "baseline");
    return 0;
}
